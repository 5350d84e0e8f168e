-- Back to version 014: outbox_chain_complete as 013 made it.
CREATE OR REPLACE FUNCTION outbox_chain_complete(p_jobs bigint[], p_attempts integer[], p_channel text, p_take_by text, p_take integer,
    p_max_attempted_by integer)
RETURNS TABLE (outcome text, job_id bigint, attempt integer, args jsonb, tags text[], max_attempts integer, queue text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    l outbox_chain_jobs%ROWTYPE;
    c outbox_chains%ROWTYPE;
    n integer;
    next_job bigint;
    q text;
BEGIN
    SELECT * INTO l FROM outbox_chain_jobs WHERE outbox_chain_jobs.job_id = p_jobs[1];
    IF FOUND THEN
        SELECT * INTO c FROM outbox_chains WHERE outbox_chains.subscriber = l.subscriber AND outbox_chains.subject = l.subject FOR UPDATE;
    END IF;
    IF c.head_job IS DISTINCT FROM p_jobs[1] THEN
        -- Read again under the lock: the link may have gone meanwhile.
        PERFORM 1 FROM outbox_chain_jobs WHERE outbox_chain_jobs.job_id = p_jobs[1];
        IF FOUND THEN
            RETURN QUERY SELECT 'waiting'::text, NULL::bigint, NULL::integer, NULL::jsonb, NULL::text[], NULL::integer, NULL::text;
            RETURN;
        END IF;
        l := NULL;
    END IF;
    SELECT count(*) INTO n FROM (
        SELECT 1 FROM river_job j JOIN unnest(p_jobs, p_attempts) AS u(id, att) ON j.id = u.id
         WHERE j.state::text = 'running' AND j.attempt = u.att FOR UPDATE OF j) f;
    IF n <> cardinality(p_jobs) OR (l.job_id IS NULL AND cardinality(p_jobs) <> 1) THEN
        RETURN QUERY SELECT 'fenced'::text, NULL::bigint, NULL::integer, NULL::jsonb, NULL::text[], NULL::integer, NULL::text;
        RETURN;
    END IF;
    UPDATE river_job SET state = 'completed', finalized_at = clock_timestamp() WHERE id = ANY(p_jobs);
    IF l.job_id IS NULL THEN
        RETURN QUERY SELECT 'completed'::text, NULL::bigint, NULL::integer, NULL::jsonb, NULL::text[], NULL::integer, NULL::text;
        RETURN;
    END IF;
    DELETE FROM outbox_chain_jobs
     WHERE outbox_chain_jobs.job_id = ANY(p_jobs) AND outbox_chain_jobs.subscriber = l.subscriber AND outbox_chain_jobs.subject = l.subject;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n <> cardinality(p_jobs) THEN
        RAISE EXCEPTION 'outbox_chain_complete: jobs % are not all in the chain of job %', p_jobs, p_jobs[1];
    END IF;
    SELECT outbox_chain_jobs.job_id INTO next_job FROM outbox_chain_jobs
     WHERE outbox_chain_jobs.subscriber = l.subscriber AND outbox_chain_jobs.subject = l.subject ORDER BY pos LIMIT 1;
    IF next_job IS NULL THEN
        DELETE FROM outbox_chains WHERE outbox_chains.subscriber = l.subscriber AND outbox_chains.subject = l.subject;
        RETURN QUERY SELECT 'advanced'::text, NULL::bigint, NULL::integer, NULL::jsonb, NULL::text[], NULL::integer, NULL::text;
        RETURN;
    END IF;
    UPDATE outbox_chains SET head_job = next_job, blocked_at = NULL, blocked_state = NULL, blocked_error = NULL
     WHERE outbox_chains.subscriber = l.subscriber AND outbox_chains.subject = l.subject;
    IF p_take_by IS NOT NULL AND p_take > 0 THEN
        RETURN QUERY
        WITH nx AS (
            SELECT k.job_id, k.pos FROM outbox_chain_jobs k
             WHERE k.subscriber = l.subscriber AND k.subject = l.subject ORDER BY k.pos LIMIT p_take),
        run AS (
            -- The prefix of them that is pending, due and of the completed
            -- jobs' kind: a job that is not (cancelled by hand, scheduled
            -- for later, inserted by a release whose subscriber mapped its
            -- events to jobs of its own) ends the take.
            SELECT nx.job_id, nx.pos,
                   bool_and(j.state = 'pending' AND j.scheduled_at <= clock_timestamp()
                            AND j.kind = (SELECT h.kind FROM river_job h WHERE h.id = p_jobs[1])) OVER (ORDER BY nx.pos) AS ok
              FROM nx JOIN river_job j ON j.id = nx.job_id),
        tk AS (
            UPDATE river_job j
               SET state = 'running', attempt = j.attempt + 1, attempted_at = clock_timestamp(),
                   attempted_by = array_append(
                       CASE WHEN array_length(j.attempted_by, 1) >= p_max_attempted_by
                       THEN j.attempted_by[array_length(j.attempted_by, 1) + 2 - p_max_attempted_by:]
                       ELSE j.attempted_by END,
                       p_take_by)
              FROM run WHERE j.id = run.job_id AND run.ok AND j.state::text = 'pending'
            RETURNING j.id, j.attempt, j.args, j.tags::text[] AS tags, j.max_attempts::integer AS max_attempts, j.queue, run.pos)
        SELECT 'advanced'::text, tk.id, tk.attempt::integer, tk.args, tk.tags, tk.max_attempts, tk.queue::text FROM tk ORDER BY tk.pos;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    -- Released for River's fetch, as outbox_chain_advance releases it.
    UPDATE river_job
       SET state = CASE WHEN scheduled_at > clock_timestamp() THEN 'scheduled'::river_job_state ELSE 'available'::river_job_state END
     WHERE id = next_job AND state = 'pending'
    RETURNING river_job.queue INTO q;
    IF q IS NOT NULL AND p_channel IS NOT NULL THEN
        PERFORM pg_notify(p_channel, json_build_object('queue', q)::text);
    END IF;
    RETURN QUERY SELECT 'advanced'::text, NULL::bigint, NULL::integer, NULL::jsonb, NULL::text[], NULL::integer, NULL::text;
END
$$;
