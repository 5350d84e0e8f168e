-- Ordered subscribers run on (issue 30): the worker that completes a
-- chain's head may take the next job of the chain itself, in the statement
-- that completes the head, and run it at once, instead of releasing it for
-- River's next fetch. One statement per job, and no fetch, where a
-- completion used to take four round trips and a fetch.
--
-- outbox_chain_sweep leaves a head completed less than a second ago to its
-- worker (see below).
--
-- Online: functions only.

-- outbox_chain_complete completes p_jobs, which River runs in p_attempts —
-- a chain's head, then the jobs right behind it that an earlier call took —
-- and moves the chain on past them, in one statement: a compare-and-set as
-- in outbox_chain_advance (p_jobs[1] is the head, and River runs every job
-- in its very attempt, else nothing is done). The jobs are completed as
-- River's JobCompleteTx completes a job (v0.51.2: state completed,
-- finalized_at; River's completer, when the worker returns, finds the job
-- it gave completed and leaves it, but for metadata the handler recorded,
-- which it merges).
--
-- Then, with p_take_by given (the River client's ID), up to p_take of the
-- chain's next jobs are taken, in chain order and as long as each is
-- pending, due and of p_jobs' kind: made running in their next attempt by p_take_by, as
-- River's fetch makes a job running (JobGetAvailable: attempt,
-- attempted_at, attempted_by trimmed to p_max_attempted_by), and returned
-- for the caller to run, the head first. Otherwise the next job is released
-- as outbox_chain_advance releases it.
--
-- One row per job taken, or one row with a NULL job_id. Outcomes:
-- 'advanced'; 'completed' (a single p_job in no chain: completed as an
-- unordered job, fenced all the same); 'waiting' and 'fenced' as in
-- outbox_chain_advance (nothing done).
CREATE FUNCTION outbox_chain_complete(p_jobs bigint[], p_attempts integer[], p_channel text, p_take_by text, p_take integer,
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
         WHERE j.state = 'running' AND j.attempt = u.att FOR UPDATE OF j) f;
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
              FROM run WHERE j.id = run.job_id AND run.ok AND j.state = 'pending'
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

-- outbox_chain_sweep as in 008, but a head completed less than a second ago
-- is not released yet: its worker may be about to move the chain on.
CREATE OR REPLACE FUNCTION outbox_chain_sweep(subs text[], continue_subs text[], lim integer, p_channel text, lock_class integer)
RETURNS TABLE (subscriber text, subject text, job_id bigint, action text, state text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    s text;
    r record;
    a record;
BEGIN
    FOREACH s IN ARRAY subs LOOP
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(lock_class, hashtext(s));
        FOR r IN
            SELECT c.subject, c.head_job, c.blocked_at IS NOT NULL AS blocked, j.id IS NOT NULL AS found, j.state::text AS jstate,
                   j.errors[array_upper(j.errors, 1)]->>'error' AS last_error
              FROM outbox_chains c LEFT JOIN river_job j ON j.id = c.head_job
             WHERE c.subscriber = s AND c.head_job IS NOT NULL
               AND ((c.blocked_at IS NULL AND (j.id IS NULL OR j.state IN ('cancelled', 'discarded')
                    -- A head completed by a worker that moves its chain on
                    -- itself afterwards (OrderedMiddleware after the worker's
                    -- own JobCompleteTx) is its worker's to move for a
                    -- second before the sweep releases the next.
                    OR (j.state = 'completed' AND j.finalized_at < now() - interval '1 second')))
                 OR (c.blocked_at IS NOT NULL AND j.id IS NOT NULL AND j.state NOT IN ('cancelled', 'discarded')))
             LIMIT lim
               FOR UPDATE OF c SKIP LOCKED
        LOOP
            IF r.blocked THEN
                UPDATE outbox_chains SET blocked_at = NULL, blocked_state = NULL, blocked_error = NULL
                 WHERE outbox_chains.subscriber = s AND outbox_chains.subject = r.subject;
                RETURN QUERY SELECT s, r.subject, r.head_job, 'unblocked'::text, r.jstate;
            ELSIF r.jstate = 'completed' OR s = ANY(continue_subs) THEN
                SELECT * INTO a FROM outbox_chain_advance(r.head_job, NULL, p_channel);
                RETURN QUERY SELECT s, r.subject, r.head_job,
                    CASE WHEN r.jstate = 'completed' THEN 'released' ELSE 'skipped' END, coalesce(r.jstate, 'deleted');
            ELSE
                UPDATE outbox_chains SET blocked_at = now(), blocked_state = coalesce(r.jstate, 'deleted'), blocked_error = r.last_error
                 WHERE outbox_chains.subscriber = s AND outbox_chains.subject = r.subject;
                RETURN QUERY SELECT s, r.subject, r.head_job, 'blocked'::text, coalesce(r.jstate, 'deleted');
            END IF;
        END LOOP;
        DELETE FROM outbox_chains c
         WHERE (c.subscriber, c.subject) IN (
            SELECT e.subscriber, e.subject FROM outbox_chains e
             WHERE e.subscriber = s AND e.head_job IS NULL AND e.blocked_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM outbox_chain_jobs l WHERE l.subscriber = e.subscriber AND l.subject = e.subject)
             LIMIT lim
               FOR UPDATE SKIP LOCKED);
    END LOOP;
END
$$;

-- outbox_chain_prepare, a 12-argument overload: as 011's, but a chain whose
-- lock is false is not locked (nor created) here. Its round inserts every
-- job of it pending and locks the chain only in its stamp, to append them
-- (the ChainAppendLate statement): a chain's row is then locked for the
-- stamp, not for the whole round, so the workers that complete its head
-- (which lock it too) do not wait for every round in flight. The order
-- between rounds does not need the lock: a round waits for (or defers
-- behind) a round that fans out an earlier event of the chain, on the
-- event's row. A coalescing subscriber's chains are locked here still: its
-- job may replace the pending tail instead of being inserted.
CREATE FUNCTION outbox_chain_prepare(subs text[], subjects text[], min_seqs bigint[], max_seqs bigint[], res text[], blocks boolean[],
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
        SELECT u.sub, u.subj, u.n FROM unnest(subs, subjects, counts, locks) AS u(sub, subj, n, lk) WHERE u.lk ORDER BY u.sub, u.subj
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
