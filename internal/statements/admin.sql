-- Receipts, and the operator's statements on events.

-- name: Await
-- The receipts of the events $1 (IDs as text): the event's state, and the
-- pairs still owed at the time (subscriber -> null, or the last error of a
-- poisoned one).
SELECT e.id, e.fanned_out_at, e.fanout, e.poisoned_at IS NOT NULL, coalesce(e.last_error, ''),
       (SELECT jsonb_object_agg(d.subscriber, CASE WHEN d.poisoned_at IS NOT NULL THEN coalesce(d.last_error, '') END)
          FROM /* TEMPLATE: schema */outbox_deliveries d WHERE d.event_seq = e.seq)
  FROM /* TEMPLATE: schema */outbox_events e
 WHERE e.id = ANY($1::text[]::uuid[]);

-- name: AwaitDone
-- Which of the events $1 are fanned out or poisoned.
SELECT id::text FROM /* TEMPLATE: schema */outbox_events
 WHERE id = ANY($1::text[]::uuid[]) AND (fanned_out_at IS NOT NULL OR poisoned_at IS NOT NULL);

-- name: Inspect
SELECT seq, id, type, subject, scope, payload, created_at, fanned_out_at, fanout, attempts, last_error, next_attempt_at, poisoned_at
  FROM /* TEMPLATE: schema */outbox_events
 WHERE id = $1;

-- Requeue and Discard of one event, by ID: $1 the event's ID, $2 a type
-- regexp or NULL, $3 a subscriber or NULL. The event is selected when it
-- exists and its type matches $2; without $3 it is acted on as a whole (the
-- event itself if it is poisoned, and every poisoned pair of it), with $3
-- only its pair of $3. Each returns whether there is anything to act on
-- (the event, or with $3 its pair of $3, owed or poisoned) and how many
-- rows it changed (the event itself counts one, each pair one).

-- name: Requeue
-- Attempts start again; the pairs' error history stays.
WITH ev AS (
    SELECT seq FROM /* TEMPLATE: schema */outbox_events
     WHERE id = $1 AND ($2::text IS NULL OR ('.' || type) ~ $2)),
requeued AS (
    UPDATE /* TEMPLATE: schema */outbox_events SET poisoned_at = NULL, attempts = 0, last_error = NULL, next_attempt_at = NULL,
           xact_id = pg_current_xact_id() -- pending again: above every relay's claim floor
     WHERE seq IN (SELECT seq FROM ev) AND poisoned_at IS NOT NULL AND $3::text IS NULL
    RETURNING seq),
pairs AS (
    UPDATE /* TEMPLATE: schema */outbox_deliveries SET poisoned_at = NULL, attempts = 0, next_attempt_at = now()
     WHERE event_seq IN (SELECT seq FROM ev) AND poisoned_at IS NOT NULL AND ($3::text IS NULL OR subscriber = $3)
    RETURNING event_seq)
SELECT CASE WHEN $3::text IS NULL THEN EXISTS (SELECT 1 FROM ev)
            ELSE EXISTS (SELECT 1 FROM /* TEMPLATE: schema */outbox_deliveries
                          WHERE event_seq IN (SELECT seq FROM ev) AND subscriber = $3) END,
       (SELECT count(*) FROM requeued) + (SELECT count(*) FROM pairs),
       (SELECT pg_notify(/* TEMPLATE_BEGIN: channel_events */'standmeet_events'/* TEMPLATE_END */, ''));

-- name: Discard
-- The poisoned pairs are dropped; the row itself is deleted only when the
-- event was poisoned as a whole (never fanned out, so no subscriber's
-- fanout record lives on it).
WITH ev AS (
    SELECT seq FROM /* TEMPLATE: schema */outbox_events
     WHERE id = $1 AND ($2::text IS NULL OR ('.' || type) ~ $2)),
pairs AS (
    DELETE FROM /* TEMPLATE: schema */outbox_deliveries
     WHERE event_seq IN (SELECT seq FROM ev) AND poisoned_at IS NOT NULL AND ($3::text IS NULL OR subscriber = $3)
    RETURNING event_seq),
discarded AS (
    DELETE FROM /* TEMPLATE: schema */outbox_events
     WHERE seq IN (SELECT seq FROM ev) AND poisoned_at IS NOT NULL AND fanned_out_at IS NULL AND $3::text IS NULL
    RETURNING seq)
SELECT CASE WHEN $3::text IS NULL THEN EXISTS (SELECT 1 FROM ev)
            ELSE EXISTS (SELECT 1 FROM /* TEMPLATE: schema */outbox_deliveries
                          WHERE event_seq IN (SELECT seq FROM ev) AND subscriber = $3) END,
       (SELECT count(*) FROM discarded) + (SELECT count(*) FROM pairs);

-- By filter, a batch at a time, the events poisoned as a whole: $1 type
-- regexp or NULL, $2 batch size. The poisoned pairs by filter are
-- RequeueDeliveries and DiscardDeliveries (deliveries.sql).

-- name: RequeueEvents
WITH q AS (
    UPDATE /* TEMPLATE: schema */outbox_events SET poisoned_at = NULL, attempts = 0, last_error = NULL, next_attempt_at = NULL,
           xact_id = pg_current_xact_id() -- pending again: above every relay's claim floor
     WHERE seq IN (
           SELECT seq FROM /* TEMPLATE: schema */outbox_events
            WHERE poisoned_at IS NOT NULL AND ($1::text IS NULL OR ('.' || type) ~ $1)
            LIMIT $2 FOR UPDATE SKIP LOCKED)
    RETURNING 1)
SELECT count(*), (SELECT pg_notify(/* TEMPLATE_BEGIN: channel_events */'standmeet_events'/* TEMPLATE_END */, '')) FROM q;

-- name: DiscardEvents
-- As Discard: only events never fanned out are deleted.
WITH q AS (
    DELETE FROM /* TEMPLATE: schema */outbox_events
     WHERE seq IN (
           SELECT seq FROM /* TEMPLATE: schema */outbox_events
            WHERE poisoned_at IS NOT NULL AND fanned_out_at IS NULL AND ($1::text IS NULL OR ('.' || type) ~ $1)
            LIMIT $2 FOR UPDATE SKIP LOCKED)
    RETURNING 1)
SELECT count(*) FROM q;

-- name: Stats
-- $1 OrphanAfter in µs. Each figure from a small partial index (the
-- pending, retry, poisoned, catch-up and fanned-out indexes), so it stays
-- fast on a table of millions of rows: outbox_stats (migration 004) and
-- outbox_delivery_stats (006) count with sequential scans off, whatever the
-- planner's statistics say. The orphans are counted as Heartbeat does. The
-- blocked chains of ordered subscribers (migration 008) come from their own
-- partial index.
SELECT s.pending, s.retrying, s.poisoned + d.poisoned_events, s.catching_up, s.fanned_last_minute, s.lag_seconds, d.owed, d.poisoned,
       (SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM /* TEMPLATE: schema */outbox_subscribers
         WHERE retired_at IS NULL AND coalesce(last_served_at, registered_at) < now() - $1::bigint * interval '1 microsecond'),
       (SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM /* TEMPLATE: schema */outbox_subscribers
         WHERE paused_at IS NOT NULL AND retired_at IS NULL),
       (SELECT count(*) FROM /* TEMPLATE: schema */outbox_chains WHERE blocked_at IS NOT NULL)
  FROM /* TEMPLATE: schema */outbox_stats() s, /* TEMPLATE: schema */outbox_delivery_stats() d;
