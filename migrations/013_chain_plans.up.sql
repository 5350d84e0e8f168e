-- outbox_chain_complete as in 012, but the jobs it fences and takes are
-- found by their IDs, never through River's index on state (issue 30).
-- River's jobs are seldom pending, so the statistics say a handful are, and
-- the planner scanned every pending job, through that index, once per job
-- taken: behind a backlog of 17,000 pending jobs, one completion read
-- 23,000 pages (18 ms) to take 21 jobs. state::text matches no index, so
-- the jobs are looked up by primary key, whatever the statistics say.
--
-- outbox_chain_prepare (the 12-argument overload of 012) locks a coalescing
-- subscriber's chains in byte order ("C"), not the database's collation: a
-- worker process sends its chains' completions in one transaction, which
-- locks them in that order (chainKeyOf, ordered.go), and two orders of the
-- same rows can deadlock.
--
-- Online: functions only.
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

CREATE OR REPLACE FUNCTION outbox_chain_prepare(subs text[], subjects text[], min_seqs bigint[], max_seqs bigint[], res text[], blocks boolean[],
    counts bigint[], claimed bigint[], pair_seqs bigint[], pair_subs text[], wait_ms integer, locks boolean[])
RETURNS TABLE (subscriber text, subject text, head_job bigint, tail_job bigint, next_pos bigint, blocked boolean,
    blocker_seq bigint, blocker_due timestamptz, tail_kind text, tail_seq bigint)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    seqs bigint[];
    old_timeout text;
BEGIN
    SELECT array_agg(b.blocker_seq) INTO seqs
      FROM outbox_chain_blockers(subs, subjects, min_seqs, res, blocks, claimed, pair_seqs, pair_subs) b
     WHERE b.blocker_seq IS NOT NULL;
    IF seqs IS NOT NULL AND wait_ms > 0 THEN
        old_timeout := current_setting('lock_timeout');
        BEGIN
            PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
            PERFORM 1 FROM outbox_events WHERE seq = ANY(seqs) FOR KEY SHARE;
            PERFORM set_config('lock_timeout', old_timeout, true);
        EXCEPTION WHEN lock_not_available THEN
            NULL; -- still held: the blocker stays a blocker
        END;
    END IF;
    RETURN QUERY
    WITH up AS (
        INSERT INTO outbox_chains AS c (subscriber, subject, next_pos)
        SELECT u.sub, u.subj, u.n FROM unnest(subs, subjects, counts, locks) AS u(sub, subj, n, lk) WHERE u.lk ORDER BY u.sub COLLATE "C", u.subj COLLATE "C"
        ON CONFLICT ON CONSTRAINT outbox_chains_pkey DO UPDATE SET next_pos = c.next_pos + EXCLUDED.next_pos
        RETURNING c.subscriber, c.subject, c.head_job, c.tail_job, c.next_pos, c.blocked_at IS NOT NULL AS blocked)
    SELECT b.subscriber, b.subject, up.head_job, up.tail_job, coalesce(up.next_pos, 0::bigint), coalesce(up.blocked, false),
        b.blocker_seq, b.blocker_due,
        (SELECT j.kind FROM river_job j WHERE j.id = up.tail_job AND up.tail_job IS DISTINCT FROM up.head_job AND j.state = 'pending'),
        (SELECT l.event_seq FROM outbox_chain_jobs l WHERE l.job_id = up.tail_job)
      FROM outbox_chain_blockers(subs, subjects, max_seqs, res, blocks, claimed, pair_seqs, pair_subs) b
      LEFT JOIN up ON b.subscriber = up.subscriber AND b.subject = up.subject;
END
$$;
