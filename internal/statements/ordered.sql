-- Ordered subscribers (migration 008): a subscriber's jobs of one subject
-- form a chain; only its head is released, the others wait in River's
-- pending state, and the transaction that completes the head releases the
-- next. The logic is in the migration's functions; these call them.
--
-- Where River's insert notification is sent, River's channel is named as
-- River names it (riverpgxv5's PGNotifyMany): the schema, or
-- current_schema() for the search_path, and ".river_insert".
--
-- A river_job row these join to by ID is checked with state::text, not
-- state: River's jobs are seldom pending, so the statistics say a handful
-- are, and the planner would scan every pending job through River's index
-- on state, once per row joined (migration 013 says more).

-- name: ChainPrepare
-- Reports, for each chain a round appends to, the earliest event of its
-- subject still owed to the subscriber elsewhere (and when it is due),
-- after waiting at most $11 ms for such an event below the round's first of
-- the chain that another round is fanning out, and locks (creating if need
-- be) the chains whose $12 is true (a coalescing subscriber's; the others
-- are locked by ChainAppendLate): outbox_chain_prepare's arguments, in
-- order ($3 the chains' first seqs, $4 their last).
SELECT subscriber, subject, head_job, tail_job, next_pos, blocked, blocker_seq, blocker_due, tail_kind, tail_seq
  FROM /* TEMPLATE: schema */outbox_chain_prepare($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::boolean[],
       $7::bigint[], $8::bigint[], $9::bigint[], $10::text[], $11::integer, $12::boolean[]);

-- name: ChainAppendLate
-- Sent with the round's stamp: appends jobs inserted pending to chains that
-- ChainPrepare did not lock. It locks (creating if need be) the chains ($1
-- subscribers, $2 subjects, $3 how many jobs each, $4 the first job, $5 the
-- last), hands out their positions, links the jobs ($6 subscribers, $7
-- subjects, $8 job IDs, $9 event seqs, $10 event IDs, $11 event types; in
-- seq order within a chain), and releases the first job of each chain that
-- was empty: it is the head. River's insert notification on channel
-- "<$12 or current schema>.river_insert" wakes its producers.
WITH up AS (
    INSERT INTO /* TEMPLATE: schema */outbox_chains AS c (subscriber, subject, next_pos, head_job, tail_job)
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[]) AS u(sub, subj, n, first_job, last_job)
     ORDER BY convert_to(u.sub, 'UTF8'), convert_to(u.subj, 'UTF8') -- byte order, as a batch of completions (chainKeyOf)
    ON CONFLICT (subscriber, subject) DO UPDATE
       SET next_pos = c.next_pos + EXCLUDED.next_pos, head_job = coalesce(c.head_job, EXCLUDED.head_job), tail_job = EXCLUDED.tail_job
    RETURNING c.subscriber, c.subject, c.next_pos, c.head_job),
links AS (
    SELECT u.*, count(*) OVER (PARTITION BY u.sub, u.subj) AS n,
           row_number() OVER (PARTITION BY u.sub, u.subj ORDER BY u.seq) AS rn
      FROM unnest($6::text[], $7::text[], $8::bigint[], $9::bigint[], $10::text[]::uuid[], $11::text[]) AS u(sub, subj, job, seq, id, typ)),
ins AS (
    INSERT INTO /* TEMPLATE: schema */outbox_chain_jobs (subscriber, subject, pos, job_id, event_seq, event_id, event_type)
    SELECT l.sub, l.subj, up.next_pos - l.n + l.rn, l.job, l.seq, l.id, l.typ
      FROM links l JOIN up ON up.subscriber = l.sub AND up.subject = l.subj),
rel AS (
    -- clock_timestamp(), not now(): River gives the job the inserting
    -- client's clock, later than this transaction's start; a job a host
    -- scheduled for later stays scheduled.
    UPDATE /* TEMPLATE: schema */river_job AS j
       SET state = CASE WHEN j.scheduled_at > clock_timestamp() THEN 'scheduled'::/* TEMPLATE: schema */river_job_state
                        ELSE 'available'::/* TEMPLATE: schema */river_job_state END
      FROM up JOIN unnest($1::text[], $2::text[], $4::bigint[]) AS f(sub, subj, first_job) ON f.sub = up.subscriber AND f.subj = up.subject
     WHERE up.head_job = f.first_job AND j.id = f.first_job AND j.state::text = 'pending'
    RETURNING j.queue)
SELECT pg_notify(concat(coalesce($12::text, current_schema()), '.river_insert'), json_build_object('queue', q.queue)::text)
  FROM (SELECT DISTINCT queue FROM rel) q;

-- name: ChainAppend
-- Sent with the round's stamp: links ($1 subscribers, $2 subjects, $3
-- positions, $4 job IDs, $5 event seqs, $6 event IDs, $7 event types; a
-- link whose job exists already, a replaced tail, is updated to the newer
-- event), chains' heads and tails ($8 subscribers, $9 subjects, $10 first
-- job appended, $11 last), and the args of pending tails replaced by a
-- coalescing subscriber's newer event ($12 job IDs, $13 args).
WITH ins AS (
    INSERT INTO /* TEMPLATE: schema */outbox_chain_jobs AS l (subscriber, subject, pos, job_id, event_seq, event_id, event_type)
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::text[]::uuid[], $7::text[])
    ON CONFLICT (job_id) DO UPDATE SET event_seq = EXCLUDED.event_seq, event_id = EXCLUDED.event_id, event_type = EXCLUDED.event_type),
heads AS (
    UPDATE /* TEMPLATE: schema */outbox_chains AS c SET head_job = coalesce(c.head_job, u.first_job), tail_job = u.last_job
      FROM unnest($8::text[], $9::text[], $10::bigint[], $11::bigint[]) AS u(subscriber, subject, first_job, last_job)
     WHERE c.subscriber = u.subscriber AND c.subject = u.subject),
replaced AS (
    UPDATE /* TEMPLATE: schema */river_job AS j SET args = u.args::jsonb
      FROM unnest($12::bigint[], $13::text[]) AS u(id, args)
     WHERE j.id = u.id AND j.state::text = 'pending')
SELECT 1;

-- name: ChainDefer
-- Owes pairs that could not be appended yet ($1 seqs, $2 subscribers), or
-- counts up the deferral of pairs already owed: each is due when its blocker
-- is ($5, where known: the deliveries lane then serves a chain's pairs
-- together, in seq order), or else after $3 µs doubled by its deferrals so
-- far, at most $4 µs. A blocker due in the past (a failed event whose retry
-- has not run yet) makes its pair due at once: the relay's loop runs due
-- retries at least four times a second however busy its lanes are, so such
-- a pair is deferred again for at most that long. A deferral is not a
-- failed attempt. Pairs of a subscriber retired meanwhile are not written
-- (its registry row is read FOR KEY SHARE, as in Stamp): retiring is final.
WITH reg AS (
    SELECT name FROM /* TEMPLATE: schema */outbox_subscribers
     WHERE name = ANY($2::text[]) AND retired_at IS NULL
       FOR KEY SHARE)
INSERT INTO /* TEMPLATE: schema */outbox_deliveries AS d (event_seq, subscriber, next_attempt_at, deferrals)
SELECT u.seq, u.sub, coalesce(u.due, now() + $3::bigint * interval '1 microsecond'), 1
  FROM unnest($1::bigint[], $2::text[], $5::timestamptz[]) AS u(seq, sub, due) JOIN reg ON reg.name = u.sub
ON CONFLICT (event_seq, subscriber) DO UPDATE SET deferrals = d.deferrals + 1,
    next_attempt_at = coalesce((SELECT u.due FROM unnest($1::bigint[], $2::text[], $5::timestamptz[]) AS u(seq, sub, due)
                                 WHERE u.seq = EXCLUDED.event_seq AND u.sub = EXCLUDED.subscriber),
        now() + least($3::bigint * power(2, least(d.deferrals, 30))::bigint, $4::bigint) * interval '1 microsecond');

-- name: ChainAdvance
-- outbox_chain_advance ($1 job, $2 attempt or NULL, $3 schema or NULL for
-- River's channel): the outcome and the next job.
SELECT outcome, next_job
  FROM /* TEMPLATE: schema */outbox_chain_advance($1::bigint, $2::integer, concat(coalesce($3::text, current_schema()), '.river_insert'));

-- name: ChainComplete
-- outbox_chain_complete ($1 jobs, the chain's head first, $2 their
-- attempts, $3 schema or NULL for River's channel, $4 the River client's ID
-- to take the next jobs by, or NULL to release the next, $5 how many to take
-- at most, $6 River's cap on attempted_by): the outcome, and the jobs taken.
SELECT outcome, job_id, attempt, args, tags, max_attempts, queue
  FROM /* TEMPLATE: schema */outbox_chain_complete($1::bigint[], $2::integer[], concat(coalesce($3::text, current_schema()), '.river_insert'),
       $4::text, $5::integer, $6::integer);

-- name: ChainOutOfTurn
-- Whether job $1 is in a chain but not its head: River started it before
-- its turn (it was given back to River, by River's rescuer or by hand,
-- while jobs before it still wait). A link whose chain row is gone (what a
-- release before migration 015 may leave) is not a turn either: its
-- completion would wait, after the handler ran; the relays' repair
-- (ChainRepair) releases it.
SELECT EXISTS (SELECT 1 FROM /* TEMPLATE: schema */outbox_chain_jobs l
                 LEFT JOIN /* TEMPLATE: schema */outbox_chains c ON c.subscriber = l.subscriber AND c.subject = l.subject
                WHERE l.job_id = $1 AND c.head_job IS DISTINCT FROM l.job_id);

-- name: ChainHandBack
-- Gives jobs $1, taken by a completion (ChainComplete) in attempts $2 and
-- not run to the end, back to River. Job $4 (NULL for none) is the one whose
-- handler failed, with error $5: its attempt counts, as River counts a
-- failed attempt (the error recorded; discarded once its attempts are
-- spent), and, if it is the chain's head, River runs it again at once, with
-- its own retries from there. The others are as they were before they were
-- taken, their attempt not counted: the head available, the jobs behind it
-- pending. A job in no chain any more (released while it ran: Ordered turned
-- off, or its subscriber retired) is available too, as any job of the
-- subscriber: pending, nothing would ever release it. River's insert
-- notification on channel
-- "<$3 or current schema>.river_insert" wakes its producers.
WITH h AS (
    SELECT u.id, u.att, u.id = $4 AS failed,
           EXISTS (SELECT 1 FROM /* TEMPLATE: schema */outbox_chain_jobs l
                     JOIN /* TEMPLATE: schema */outbox_chains c ON c.subscriber = l.subscriber AND c.subject = l.subject
                    WHERE l.job_id = u.id AND c.head_job = u.id) AS head,
           NOT EXISTS (SELECT 1 FROM /* TEMPLATE: schema */outbox_chain_jobs l WHERE l.job_id = u.id) AS unlinked
      FROM unnest($1::bigint[], $2::integer[]) AS u(id, att)),
back AS (
    UPDATE /* TEMPLATE: schema */river_job AS j
       SET state = CASE WHEN h.failed AND j.attempt >= j.max_attempts THEN 'discarded'::/* TEMPLATE: schema */river_job_state
                        WHEN h.head OR h.unlinked THEN 'available'::/* TEMPLATE: schema */river_job_state
                        ELSE 'pending'::/* TEMPLATE: schema */river_job_state END,
           finalized_at = CASE WHEN h.failed AND j.attempt >= j.max_attempts THEN now() ELSE j.finalized_at END,
           errors = CASE WHEN h.failed THEN array_append(j.errors, jsonb_build_object('at', now(), 'attempt', j.attempt, 'error', $5::text, 'trace', ''))
                         ELSE j.errors END,
           attempt = CASE WHEN h.failed THEN j.attempt ELSE j.attempt - 1 END,
           attempted_at = CASE WHEN h.failed OR j.attempt > 1 THEN j.attempted_at END,
           attempted_by = CASE WHEN h.failed THEN j.attempted_by ELSE j.attempted_by[1:array_length(j.attempted_by, 1) - 1] END
      FROM h
     WHERE j.id = h.id AND j.state::text = 'running' AND j.attempt = h.att
    RETURNING j.queue, j.state)
SELECT pg_notify(concat(coalesce($3::text, current_schema()), '.river_insert'), json_build_object('queue', queue)::text)
  FROM back WHERE state = 'available';

-- name: ChainSweep
-- outbox_chain_sweep ($1 subscribers, $2 those that continue past a
-- discarded head, $3 limit, $4 schema or NULL for River's channel, $5 the
-- advisory lock's class).
SELECT subscriber, subject, job_id, action, state
  FROM /* TEMPLATE: schema */outbox_chain_sweep($1::text[], $2::text[], $3::integer,
       concat(coalesce($4::text, current_schema()), '.river_insert'), $5::integer);

-- name: ChainRelease
-- Releases up to $2 links of the chains of subscribers $1, which the relay
-- serves unordered (Ordered turned off): each link goes and its job, if
-- still pending, is made available (scheduled if the host scheduled it for
-- later), and River's producers are told ($3 schema or NULL for River's
-- channel). Returns how many links went. The jobs then run as any job of
-- the subscriber.
WITH l AS (
    DELETE FROM /* TEMPLATE: schema */outbox_chain_jobs
     WHERE job_id IN (SELECT job_id FROM /* TEMPLATE: schema */outbox_chain_jobs
                       WHERE subscriber = ANY($1::text[]) LIMIT $2 FOR UPDATE SKIP LOCKED)
    RETURNING job_id),
r AS (
    UPDATE /* TEMPLATE: schema */river_job
       SET state = CASE WHEN scheduled_at > now() THEN 'scheduled'::/* TEMPLATE: schema */river_job_state
                        ELSE 'available'::/* TEMPLATE: schema */river_job_state END
     WHERE id IN (SELECT job_id FROM l) AND state::text = 'pending'
    RETURNING queue)
SELECT (SELECT count(*) FROM l),
       (SELECT count(pg_notify(concat(coalesce($3::text, current_schema()), '.river_insert'), json_build_object('queue', q.queue)::text))
          FROM (SELECT DISTINCT queue FROM r) q);

-- name: ChainRepair
-- Repairs what a release before migration 015 may leave, while it still
-- runs during a rolling deploy or after it, and heads left pending: links
-- whose chain row is gone
-- (its drop of an empty chain raced an append) and ordered jobs ($3 the
-- ordered tag) pending in no chain (its hand-back of jobs taken in a chain
-- released meanwhile; a live worker's hand-back racing a release can leave
-- one too). Every write that links a job, or unlinks a pending one, does so
-- in the transaction that makes the job pending or releases it, so neither
-- state is seen while a job is being linked. Each such link goes, and its
-- job, like each such job, is made available (scheduled if the host
-- scheduled it for later), at most $1 of each; River's producers are told
-- ($2 schema or NULL for River's channel). Returns how many jobs it
-- released. It reads every link and every pending ordered job: the relays
-- run it at every tenth sweep (internal/maintenance's ChainSweeper), not every sweep.
WITH orphan AS (
    DELETE FROM /* TEMPLATE: schema */outbox_chain_jobs l
     WHERE l.job_id IN (SELECT k.job_id FROM /* TEMPLATE: schema */outbox_chain_jobs k
                         WHERE NOT EXISTS (SELECT 1 FROM /* TEMPLATE: schema */outbox_chains c
                                            WHERE c.subscriber = k.subscriber AND c.subject = k.subject)
                         LIMIT $1 FOR UPDATE SKIP LOCKED)
    RETURNING l.job_id),
stranded AS (
    SELECT j.id FROM /* TEMPLATE: schema */river_job j
     WHERE j.state = 'pending' AND $3::text = ANY(j.tags)
       AND NOT EXISTS (SELECT 1 FROM /* TEMPLATE: schema */outbox_chain_jobs l WHERE l.job_id = j.id)
     LIMIT $1 FOR UPDATE SKIP LOCKED),
-- Heads left pending: a chain's head is released in the transaction that
-- makes it the head, so one seen pending here never will be (seen once in
-- the ordered chaos run, its cause not found). One probe of river_job's key
-- per chain.
heads AS (
    SELECT j.id FROM /* TEMPLATE: schema */outbox_chains c
      JOIN /* TEMPLATE: schema */river_job j ON j.id = c.head_job
     WHERE j.state::text = 'pending'
     LIMIT $1 FOR UPDATE OF j SKIP LOCKED),
r AS (
    UPDATE /* TEMPLATE: schema */river_job
       SET state = CASE WHEN scheduled_at > now() THEN 'scheduled'::/* TEMPLATE: schema */river_job_state
                        ELSE 'available'::/* TEMPLATE: schema */river_job_state END
     -- One array, looked up by primary key: an OR of the two subqueries
     -- would read all of river_job, which keeps finished jobs for a day.
     WHERE id = ANY(ARRAY(SELECT job_id FROM orphan UNION ALL SELECT id FROM stranded UNION ALL SELECT id FROM heads))
       AND state::text = 'pending'
    RETURNING queue)
SELECT (SELECT count(*) FROM r),
       (SELECT count(pg_notify(concat(coalesce($2::text, current_schema()), '.river_insert'), json_build_object('queue', q.queue)::text))
          FROM (SELECT DISTINCT queue FROM r) q);

-- name: ChainRetired
-- The retired subscribers that still have chains. Retiring is final: every
-- relay's sweep releases their chains (ChainRelease), whichever release
-- appended to them, before or after the retirement (relays that were
-- running then still deliver to it until they restart). outbox_subscribers
-- is small; each retired name is one probe of outbox_chains' key.
SELECT coalesce(array_agg(s.name ORDER BY s.name), '{}')
  FROM /* TEMPLATE: schema */outbox_subscribers s
 WHERE s.retired_at IS NOT NULL
   AND EXISTS (SELECT 1 FROM /* TEMPLATE: schema */outbox_chains c WHERE c.subscriber = s.name);

-- name: ChainRescue
-- Gives back to River the heads of the chains of subscribers $1 that run on
-- a River client whose process died: every relay row of that client (the
-- last one in attempted_by) that started before the run did (or, if none
-- did, every one) was never marked stopped and has not reported in for $2
-- µs, and the run began longer ago than that. A relay row that started
-- after the run cannot be the process running it: a process restarted under
-- the same client ID (a stable River Config.ID, as a StatefulSet's pod
-- name) does not keep its dead predecessor's jobs alive. As River's rescuer
-- does, but within a minute rather than an hour: the job is available
-- again (discarded if its attempts are spent), an error recorded, River's
-- producers told ($3 schema or NULL for River's channel). The dead run can
-- never complete it: a completion is fenced on the attempt. A client with
-- no relay row (a worker-only process), or whose relay stopped gracefully,
-- is left to River's rescuer. It reads River's running jobs (River's state
-- index), as many as there are workers busy, not every chain.
WITH dead AS (
    SELECT j.id, j.attempt, j.max_attempts, a.client
      FROM /* TEMPLATE: schema */river_job j
      JOIN /* TEMPLATE: schema */outbox_chain_jobs l ON l.job_id = j.id
     CROSS JOIN LATERAL (SELECT j.attempted_by[array_upper(j.attempted_by, 1)] AS client) a
     WHERE j.state = 'running' AND l.subscriber = ANY($1::text[])
       -- The chain's head (a scalar subquery: one primary-key lookup per
       -- running job, never a scan of every chain).
       AND (SELECT c.head_job FROM /* TEMPLATE: schema */outbox_chains c
             WHERE c.subscriber = l.subscriber AND c.subject = l.subject) = j.id
       AND j.attempted_at < now() - $2::bigint * interval '1 microsecond'
       -- Every relay row of the client that started before the run silent
       -- and never stopped; if none started before it (River fetched the
       -- job before the relay's first heartbeat), every relay row of the
       -- client (none at all: NULL, not dead).
       AND (SELECT coalesce(bool_and(r.silent) FILTER (WHERE r.started_at <= j.attempted_at), bool_and(r.silent))
              FROM (SELECT r.started_at, r.stopped_at IS NULL AND r.last_seen_at < now() - $2::bigint * interval '1 microsecond' AS silent
                      FROM /* TEMPLATE: schema */outbox_relays r WHERE r.river_client_id = a.client) r)
       FOR UPDATE OF j SKIP LOCKED),
up AS (
    UPDATE /* TEMPLATE: schema */river_job AS j
       SET state = CASE WHEN d.attempt < d.max_attempts THEN 'available'::/* TEMPLATE: schema */river_job_state
                        ELSE 'discarded'::/* TEMPLATE: schema */river_job_state END,
           finalized_at = CASE WHEN d.attempt < d.max_attempts THEN NULL ELSE now() END,
           scheduled_at = now(),
           errors = array_append(j.errors, jsonb_build_object('at', now(), 'attempt', d.attempt, 'trace', '',
               'error', 'events: the process of River client ' || d.client ||
                        ' stopped heartbeating while it ran this ordered job: given back to River'))
      FROM dead d
     WHERE j.id = d.id
    RETURNING j.id, j.queue, j.state::text AS state, d.client),
-- The jobs behind such a head that the dead run had taken to run on
-- (outbox_chain_complete) go back to pending: they follow the head in their
-- turn. As River's rescuer counts the attempt of every job a dead process
-- had fetched, whether it started or not, their attempt stays counted (and
-- one whose attempts are spent is discarded, its chain then handled as for
-- any discarded head): were the run alive after all, its completion, fenced
-- on the attempt, must never match the attempt of the run that takes them
-- next.
behind AS (
    UPDATE /* TEMPLATE: schema */river_job AS j
       SET state = CASE WHEN j.attempt < j.max_attempts THEN 'pending'::/* TEMPLATE: schema */river_job_state
                        ELSE 'discarded'::/* TEMPLATE: schema */river_job_state END,
           finalized_at = CASE WHEN j.attempt < j.max_attempts THEN NULL ELSE now() END,
           errors = array_append(j.errors, jsonb_build_object('at', now(), 'attempt', j.attempt, 'trace', '',
               'error', 'events: the process of River client ' || d.client ||
                        ' stopped heartbeating after it took this ordered job: given back to River'))
      FROM dead d
      JOIN /* TEMPLATE: schema */outbox_chain_jobs h ON h.job_id = d.id
      JOIN /* TEMPLATE: schema */outbox_chain_jobs l ON l.subscriber = h.subscriber AND l.subject = h.subject AND l.job_id <> d.id
     WHERE j.id = l.job_id AND j.state = 'running' AND j.attempted_by[array_upper(j.attempted_by, 1)] = d.client)
SELECT up.id, up.state, up.client,
       pg_notify(concat(coalesce($3::text, current_schema()), '.river_insert'), json_build_object('queue', up.queue)::text)
  FROM up;

-- name: ChainLockEmpty
-- Locks the chain rows of subscribers $1 that have no link left, skipping
-- those another transaction holds (a round appending to them). A row this
-- returns may have links after all: an append that committed while the
-- statement ran is not in its snapshot. ChainDropEmpty, the next statement,
-- looks again.
SELECT c.subscriber, c.subject FROM /* TEMPLATE: schema */outbox_chains c
 WHERE c.subscriber = ANY($1::text[])
   AND NOT EXISTS (SELECT 1 FROM /* TEMPLATE: schema */outbox_chain_jobs l WHERE l.subscriber = c.subscriber AND l.subject = c.subject)
   FOR UPDATE SKIP LOCKED;

-- name: ChainDropEmpty
-- Deletes the chain rows ($1 subscribers, $2 subjects) that ChainLockEmpty
-- locked, in the same transaction, and that have no link left. A statement
-- of its own, with a snapshot taken once the locks are held, so that it
-- sees every link appended before them (under READ COMMITTED a DELETE that
-- waits on a row rechecks the row, but its subquery keeps the snapshot it
-- started with: the chain went, the link an append had just added stayed,
-- in no chain, its job held for good).
DELETE FROM /* TEMPLATE: schema */outbox_chains c
 USING unnest($1::text[], $2::text[]) AS u(sub, subj)
 WHERE c.subscriber = u.sub AND c.subject = u.subj
   AND NOT EXISTS (SELECT 1 FROM /* TEMPLATE: schema */outbox_chain_jobs l WHERE l.subscriber = c.subscriber AND l.subject = c.subject);

-- name: ChainResume
-- Retries a blocked chain's head ($1 subscriber, $2 subject, $3 schema or
-- NULL): 'done', 'unknown', 'not_blocked' or 'gone'.
SELECT /* TEMPLATE: schema */outbox_chain_resume($1, $2, concat(coalesce($3::text, current_schema()), '.river_insert'));

-- name: ChainSkip
-- Gives a blocked chain's head up ($1 subscriber, $2 subject, $3 schema or
-- NULL): 'done', 'unknown' or 'not_blocked'.
SELECT /* TEMPLATE: schema */outbox_chain_skip($1, $2, concat(coalesce($3::text, current_schema()), '.river_insert'));

-- name: ListChains
-- Chains with jobs, by subscriber and subject: $1 limit, $2 subscriber or
-- NULL, $3 blocked only, $4 and $5 the cursor (subscriber, subject) or NULL.
SELECT c.subscriber, c.subject, c.head_job, c.blocked_at, coalesce(c.blocked_state, ''), coalesce(c.blocked_error, ''),
       l.event_id, l.event_seq, l.event_type,
       (SELECT count(*) FROM /* TEMPLATE: schema */outbox_chain_jobs w WHERE w.subscriber = c.subscriber AND w.subject = c.subject) AS jobs,
       coalesce(j.state::text, ''), coalesce(j.attempt, 0), coalesce(j.max_attempts, 0),
       coalesce(j.errors[array_upper(j.errors, 1)]->>'error', '')
  FROM /* TEMPLATE: schema */outbox_chains c
  LEFT JOIN /* TEMPLATE: schema */outbox_chain_jobs l ON l.job_id = c.head_job
  LEFT JOIN /* TEMPLATE: schema */river_job j ON j.id = c.head_job
 WHERE c.head_job IS NOT NULL AND ($2::text IS NULL OR c.subscriber = $2) AND (NOT $3::boolean OR c.blocked_at IS NOT NULL)
   AND ($4::text IS NULL OR (c.subscriber, c.subject) > ($4, $5::text))
 ORDER BY c.subscriber, c.subject LIMIT $1;

-- name: JobState
-- A River job's state and attempt ($1 job ID): has another worker's run
-- superseded this one?
SELECT state::text, attempt FROM /* TEMPLATE: schema */river_job WHERE id = $1;

-- name: JobFence
-- Whether River runs job $1 in attempt $2, the row locked FOR UPDATE until
-- the caller's transaction ends: the fence of a completion in no chain, as
-- outbox_chain_advance's is for a chain's head.
SELECT EXISTS (SELECT 1 FROM /* TEMPLATE: schema */river_job
                WHERE id = $1 AND state = 'running' AND attempt = $2 FOR UPDATE);
