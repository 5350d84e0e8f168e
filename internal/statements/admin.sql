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

-- name: Requeue
-- Requeue of one event ($1): the event itself if it is poisoned, and every
-- poisoned pair of it. Attempts start again; the pairs' error history stays.
WITH ev AS (SELECT seq FROM /* TEMPLATE: schema */outbox_events WHERE id = $1),
requeued AS (
    UPDATE /* TEMPLATE: schema */outbox_events SET poisoned_at = NULL, attempts = 0, last_error = NULL, next_attempt_at = NULL
     WHERE id = $1 AND poisoned_at IS NOT NULL
    RETURNING seq),
pairs AS (
    UPDATE /* TEMPLATE: schema */outbox_deliveries SET poisoned_at = NULL, attempts = 0, next_attempt_at = now()
     WHERE event_seq IN (SELECT seq FROM ev) AND poisoned_at IS NOT NULL
    RETURNING event_seq)
SELECT EXISTS (SELECT 1 FROM ev), EXISTS (SELECT 1 FROM requeued) OR EXISTS (SELECT 1 FROM pairs),
       (SELECT pg_notify(/* TEMPLATE_BEGIN: channel_events */'standmeet_events'/* TEMPLATE_END */, ''));

-- name: Discard
-- Discard of one event ($1): its poisoned pairs are dropped; the row itself
-- is deleted only when the event was poisoned as a whole (never fanned out,
-- so no subscriber's fanout record lives on it).
WITH ev AS (SELECT seq FROM /* TEMPLATE: schema */outbox_events WHERE id = $1),
pairs AS (
    DELETE FROM /* TEMPLATE: schema */outbox_deliveries
     WHERE event_seq IN (SELECT seq FROM ev) AND poisoned_at IS NOT NULL
    RETURNING event_seq),
discarded AS (
    DELETE FROM /* TEMPLATE: schema */outbox_events
     WHERE id = $1 AND poisoned_at IS NOT NULL AND fanned_out_at IS NULL
    RETURNING seq)
SELECT EXISTS (SELECT 1 FROM ev), EXISTS (SELECT 1 FROM discarded) OR EXISTS (SELECT 1 FROM pairs);

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
