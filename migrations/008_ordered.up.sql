-- Ordered subscribers (issue 23): one subject's events handled one at a
-- time, in order, while subjects run in parallel.
--
-- An ordered subscriber's jobs of one subject form a chain. Each is still
-- one River job per (event, subscriber), so River's retries, UI and
-- metrics apply; only the chain's head is released (available, running,
-- retryable, ...), the jobs behind it wait in River's pending state, and
-- the next one is released in the same transaction that completes the head.
--
-- Version 008 although 007 does not exist yet: another change is numbered
-- 007. Migrate applies every version the database lacks, whatever higher
-- ones it has.
--
-- Online: two new tables built empty, a column with a constant default on
-- outbox_deliveries (no rewrite), and functions. outbox_events is not
-- touched.

-- A chain: one (ordered subscriber, subject) with jobs not yet finished.
-- The row exists only while the chain has such jobs, or is blocked (a row
-- with no job, kept by a round that deferred all of its events, is deleted
-- by the relays' sweep). A relay's stamp and a worker's completion lock it
-- (FOR UPDATE), so appends to a chain and moves of its head take turns.
CREATE TABLE outbox_chains (
    subscriber    text        NOT NULL,
    subject       text        NOT NULL,
    -- The released job: the first link. NULL only while the chain is empty.
    head_job      bigint,
    -- The last job appended: while it is not the head it is still pending,
    -- and a coalescing subscriber's next job replaces it.
    tail_job      bigint,
    -- Positions handed out to links so far.
    next_pos      bigint      NOT NULL DEFAULT 0,
    -- Set when the head's job ended discarded or cancelled (or was deleted)
    -- and the subscriber blocks on that: the chain waits for an operator
    -- (outbox_chain_resume, outbox_chain_skip).
    blocked_at    timestamptz,
    blocked_state text,
    blocked_error text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subscriber, subject)
);

-- Blocked chains, for Stats and the operator's list.
CREATE INDEX outbox_chains_blocked_idx ON outbox_chains (blocked_at)
    WHERE blocked_at IS NOT NULL;

-- A chain's jobs not yet finished, in chain order (pos): the head first.
-- The event the job carries is kept here, so the operator's view of a chain
-- needs no event row (retention may have deleted it: handler jobs carry
-- the whole event).
CREATE TABLE outbox_chain_jobs (
    job_id     bigint NOT NULL PRIMARY KEY,
    subscriber text   NOT NULL,
    subject    text   NOT NULL,
    pos        bigint NOT NULL,
    event_seq  bigint NOT NULL,
    event_id   uuid   NOT NULL,
    event_type text   NOT NULL,
    CONSTRAINT outbox_chain_jobs_pos_key UNIQUE (subscriber, subject, pos)
);

-- A pair an ordered subscriber could not append yet (an earlier event of
-- its subject was still owed to it) is owed, and retried after a pause that
-- doubles with each deferral, counted here; a deferral is not a failure.
ALTER TABLE outbox_deliveries ADD COLUMN deferrals integer NOT NULL DEFAULT 0;

-- outbox_chain_blockers reports, for each chain (subs[i], subjects[i])
-- whose events in a round go up to max_seqs[i], the earliest event of that
-- subject still owed to the subscriber elsewhere — an event not fanned out
-- yet whose type matches res[i], or an owed pair (a poisoned one only where
-- blocks[i]), leaving out the round's own rows (claimed) and pairs
-- (pair_seqs, pair_subs) — with when it is due next, where that is known
-- (an owed pair's or a retrying event's next attempt): a pair deferred
-- behind it is due then too, so that the deliveries lane serves a chain's
-- deferred pairs together, in seq order. Reads come from small partial
-- indexes (pending events; due and poisoned pairs) whatever the planner's
-- statistics say: sequential scans are off.
CREATE FUNCTION outbox_chain_blockers(subs text[], subjects text[], max_seqs bigint[], res text[], blocks boolean[],
    claimed bigint[], pair_seqs bigint[], pair_subs text[])
RETURNS TABLE (subscriber text, subject text, blocker_seq bigint, blocker_due timestamptz)
LANGUAGE sql
STABLE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
WITH ch AS MATERIALIZED (
    SELECT * FROM unnest(subs, subjects, max_seqs, res, blocks) AS c(sub, subj, max_seq, re, block)),
ev AS MATERIALIZED (
    SELECT e.seq, e.subject, e.type, CASE WHEN e.attempts > 0 THEN e.next_attempt_at END AS due FROM outbox_events e
     WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL
       AND e.seq < (SELECT max(max_seq) FROM ch) AND e.subject = ANY(subjects)
       AND e.seq <> ALL(coalesce(claimed, '{}'))),
pr AS MATERIALIZED (
    SELECT d.event_seq AS seq, d.subscriber AS sub, e.subject, d.poisoned, d.due FROM (
        SELECT event_seq, subscriber, false AS poisoned, next_attempt_at AS due FROM outbox_deliveries
         WHERE subscriber = ANY(subs) AND poisoned_at IS NULL
        UNION ALL
        SELECT event_seq, subscriber, true, NULL FROM outbox_deliveries
         WHERE poisoned_at IS NOT NULL AND subscriber = ANY(subs)) d
      JOIN outbox_events e ON e.seq = d.event_seq
     WHERE e.subject = ANY(subjects)
       AND NOT EXISTS (SELECT 1 FROM unnest(pair_seqs, pair_subs) AS p(seq, sub) WHERE p.seq = d.event_seq AND p.sub = d.subscriber))
SELECT ch.sub, ch.subj, b.seq, b.due
  FROM ch LEFT JOIN LATERAL (
    SELECT x.seq, x.due FROM (
        SELECT ev.seq, ev.due FROM ev WHERE ev.subject = ch.subj AND ev.seq < ch.max_seq AND ('.' || ev.type) ~ ch.re
        UNION ALL
        SELECT pr.seq, pr.due FROM pr WHERE pr.sub = ch.sub AND pr.subject = ch.subj AND pr.seq < ch.max_seq
           AND (ch.block OR NOT pr.poisoned)) x
     ORDER BY x.seq LIMIT 1) b ON true
$$;

-- outbox_chain_prepare is the first step of a round that appends jobs of
-- ordered subscribers. An earlier event that blocks a chain (see
-- outbox_chain_blockers) is most often being fanned out by another round at
-- that very moment: the round waits for it, at most wait_ms (a lock wait on
-- the blocker's event row, which that round holds FOR UPDATE; one that
-- nobody holds costs nothing), and looks again. Then it locks each chain's
-- row, creating it if need be and reserving counts[i] positions, and
-- returns it with its remaining blocker (and when that is due) and the kind
-- of its tail job while that is pending. Chain rows are locked in (subscriber, subject) order, and
-- only after the wait, so rounds never deadlock on them.
CREATE FUNCTION outbox_chain_prepare(subs text[], subjects text[], max_seqs bigint[], res text[], blocks boolean[],
    counts bigint[], claimed bigint[], pair_seqs bigint[], pair_subs text[], wait_ms integer)
RETURNS TABLE (subscriber text, subject text, head_job bigint, tail_job bigint, next_pos bigint, blocked boolean,
    blocker_seq bigint, blocker_due timestamptz, tail_kind text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    seqs bigint[];
    old_timeout text;
BEGIN
    SELECT array_agg(b.blocker_seq) INTO seqs
      FROM outbox_chain_blockers(subs, subjects, max_seqs, res, blocks, claimed, pair_seqs, pair_subs) b
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
        SELECT u.sub, u.subj, u.n FROM unnest(subs, subjects, counts) AS u(sub, subj, n) ORDER BY u.sub, u.subj
        ON CONFLICT ON CONSTRAINT outbox_chains_pkey DO UPDATE SET next_pos = c.next_pos + EXCLUDED.next_pos
        RETURNING c.subscriber, c.subject, c.head_job, c.tail_job, c.next_pos, c.blocked_at IS NOT NULL AS blocked)
    SELECT up.subscriber, up.subject, up.head_job, up.tail_job, up.next_pos, up.blocked, b.blocker_seq, b.blocker_due,
        (SELECT j.kind FROM river_job j WHERE j.id = up.tail_job AND up.tail_job IS DISTINCT FROM up.head_job AND j.state = 'pending')
      FROM up JOIN outbox_chain_blockers(subs, subjects, max_seqs, res, blocks, claimed, pair_seqs, pair_subs) b
        ON b.subscriber = up.subscriber AND b.subject = up.subject;
END
$$;

-- outbox_chain_advance moves a chain on past its head p_job: the job's link
-- goes, the next job (if any) becomes the head and is released, and an
-- empty chain's row goes. It is a compare-and-set: it does nothing, and
-- returns the outcome, unless p_job is the chain's head and, with p_attempt
-- given (a worker completing the job), River has the job running in that
-- very attempt — so a worker whose job River rescued and gave to another
-- (a zombie) cannot move the chain, and neither can a second completion of
-- one job. The caller completes p_job in the same transaction, so a crash
-- releases neither both nor none.
--
-- Releasing is the UPDATE of river_job below, which does for a pending job
-- what River's Client.JobRetryTx does (v0.51.2: state available), with two
-- differences that matter here: it touches only a job still pending, so a
-- successor that an operator cancelled or retried by hand is not brought
-- back, and it keeps the job's scheduled_at (when it was appended), so the
-- released job goes ahead of jobs inserted since rather than to the back of
-- its queue; it is one statement with the compare-and-set and the
-- notification, for the worker, the relays' sweep and the operator's skip
-- alike. The notification is River's insert notification on p_channel
-- (its producers then fetch at once instead of at their next poll).
--
-- Outcomes: 'advanced'; 'gone' (p_job is in no chain: skipped, or its chain
-- was removed); 'waiting' (p_job is in a chain but not its head: it was
-- started out of turn, by hand); 'fenced' (the head, but not running in
-- p_attempt).
CREATE FUNCTION outbox_chain_advance(p_job bigint, p_attempt integer, p_channel text,
    OUT outcome text, OUT next_job bigint)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    l outbox_chain_jobs%ROWTYPE;
    c outbox_chains%ROWTYPE;
    j_state text;
    j_attempt integer;
    q text;
BEGIN
    SELECT * INTO l FROM outbox_chain_jobs WHERE job_id = p_job;
    IF NOT FOUND THEN
        outcome := 'gone';
        RETURN;
    END IF;
    SELECT * INTO c FROM outbox_chains WHERE outbox_chains.subscriber = l.subscriber AND outbox_chains.subject = l.subject FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'gone';
        RETURN;
    END IF;
    IF c.head_job IS DISTINCT FROM p_job THEN
        -- Read again under the lock: the link may have gone meanwhile.
        PERFORM 1 FROM outbox_chain_jobs WHERE job_id = p_job;
        outcome := CASE WHEN FOUND THEN 'waiting' ELSE 'gone' END;
        RETURN;
    END IF;
    IF p_attempt IS NOT NULL THEN
        SELECT state::text, attempt INTO j_state, j_attempt FROM river_job WHERE id = p_job FOR UPDATE;
        IF NOT FOUND OR j_state <> 'running' OR j_attempt <> p_attempt THEN
            outcome := 'fenced';
            RETURN;
        END IF;
    END IF;
    DELETE FROM outbox_chain_jobs WHERE job_id = p_job;
    SELECT job_id INTO next_job FROM outbox_chain_jobs
     WHERE outbox_chain_jobs.subscriber = l.subscriber AND outbox_chain_jobs.subject = l.subject ORDER BY pos LIMIT 1;
    IF next_job IS NULL THEN
        DELETE FROM outbox_chains WHERE outbox_chains.subscriber = l.subscriber AND outbox_chains.subject = l.subject;
    ELSE
        UPDATE outbox_chains SET head_job = next_job, blocked_at = NULL, blocked_state = NULL, blocked_error = NULL
         WHERE outbox_chains.subscriber = l.subscriber AND outbox_chains.subject = l.subject;
        -- clock_timestamp(), not now(): this transaction may have waited
        -- for the chain's lock while a round appended the next job, and
        -- River gives a job its inserting transaction's now(), later than
        -- ours. A job a host scheduled for later stays scheduled.
        UPDATE river_job
           SET state = CASE WHEN scheduled_at > clock_timestamp() THEN 'scheduled'::river_job_state ELSE 'available'::river_job_state END
         WHERE id = next_job AND state = 'pending'
        RETURNING queue INTO q;
        IF q IS NOT NULL AND p_channel IS NOT NULL THEN
            PERFORM pg_notify(p_channel, json_build_object('queue', q)::text);
        END IF;
    END IF;
    outcome := 'advanced';
END
$$;

-- outbox_chain_sweep is the relays' periodic look at the chains of the
-- subscribers subs, one subscriber at a time (a transaction-level advisory
-- try-lock per subscriber: whichever relay takes it sweeps, the others
-- skip), at most lim chains each. River does not tell anyone when it
-- discards a job after its last attempt, or when an operator cancels or
-- deletes one, so the sweep looks for heads whose job is finished:
--
--   completed: the completion did not move the chain (a worker without the
--     library's completion, such as a Map subscriber's worker without
--     OrderedMiddleware): the chain moves on now ('released');
--   discarded, cancelled, or gone from River: for a subscriber in
--     continue_subs the chain moves on ('skipped'); for any other it is
--     blocked ('blocked') until an operator resumes or skips it.
--
-- A blocked chain whose head runs again (retried by hand in River UI) is
-- unblocked ('unblocked'). Chains with no job left (kept by a round that
-- deferred everything) are deleted. Returns what it did.
CREATE FUNCTION outbox_chain_sweep(subs text[], continue_subs text[], lim integer, p_channel text, lock_class integer)
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
               AND ((c.blocked_at IS NULL AND (j.id IS NULL OR j.state IN ('completed', 'cancelled', 'discarded')))
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

-- outbox_chain_resume retries a blocked chain's head: its River job is made
-- available again as River's JobRetry makes it (one more attempt if its
-- attempts are spent; river_job.sql in River v0.51.2), and the chain is
-- unblocked. outbox_chain_skip gives the blocked head up: it leaves the
-- chain (its job stays as River ended it) and the next job is released.
-- Both return 'done', 'unknown' (no such chain), 'not_blocked', or, for
-- resume, 'gone' (River no longer has the head's job: skip it instead).
CREATE FUNCTION outbox_chain_resume(p_subscriber text, p_subject text, p_channel text)
RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    c outbox_chains%ROWTYPE;
    q text;
BEGIN
    SELECT * INTO c FROM outbox_chains WHERE subscriber = p_subscriber AND subject = p_subject FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'unknown';
    END IF;
    IF c.blocked_at IS NULL THEN
        RETURN 'not_blocked';
    END IF;
    UPDATE river_job
       SET state = 'available', max_attempts = CASE WHEN attempt >= max_attempts THEN attempt + 1 ELSE max_attempts END,
           finalized_at = NULL, scheduled_at = now(), metadata = metadata - 'cancel_attempted_at'
     WHERE id = c.head_job AND state IN ('discarded', 'cancelled')
    RETURNING queue INTO q;
    IF q IS NULL THEN
        PERFORM 1 FROM river_job WHERE id = c.head_job;
        IF NOT FOUND THEN
            RETURN 'gone';
        END IF;
    ELSIF p_channel IS NOT NULL THEN
        PERFORM pg_notify(p_channel, json_build_object('queue', q)::text);
    END IF;
    UPDATE outbox_chains SET blocked_at = NULL, blocked_state = NULL, blocked_error = NULL
     WHERE subscriber = p_subscriber AND subject = p_subject;
    RETURN 'done';
END
$$;

CREATE FUNCTION outbox_chain_skip(p_subscriber text, p_subject text, p_channel text)
RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    c outbox_chains%ROWTYPE;
    a record;
BEGIN
    SELECT * INTO c FROM outbox_chains WHERE subscriber = p_subscriber AND subject = p_subject FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'unknown';
    END IF;
    IF c.blocked_at IS NULL THEN
        RETURN 'not_blocked';
    END IF;
    SELECT * INTO a FROM outbox_chain_advance(c.head_job, NULL, p_channel);
    RETURN 'done';
END
$$;
