-- Delivery state per (event, subscriber): the relay's deliveries lane and
-- the operator's statements on pairs. outbox_deliveries holds only pairs
-- still owed (retrying, poisoned, paused, or owed to a subscriber the
-- stamping relay did not know).

-- name: ClaimOwed
-- Owed pairs of the subscribers $1 the relay knows, due, one row per pair
-- with its event, up to $2; both rows locked (the event's fanout is
-- extended), skipped when another round holds either. The subscribers are
-- served in the order of $1 (the relay rotates it round by round), each
-- from its own range of the claim index in (next_attempt_at, event_seq)
-- order: no sort over every due pair, and a paused or retired subscriber's
-- pairs are never read. A round costs its batch, whatever is owed.
--
-- An ordered subscriber ($3[i]) is served by one round at a time, across
-- every relay (a transaction-level advisory try-lock of class $4 on its
-- name; a round that does not get it serves the others): two rounds whose
-- SKIP LOCKED claims interleaved within a subject would each hold an
-- earlier pair the other waits for, and defer.
--
-- Each subscriber's claim starts at its floor ($5[i], $6[i]: due time and
-- event seq, see package owedfloor), not at the start of its range: under a
-- held snapshot the entries of every pair served since stay in the index.
-- Each row also returns the pair's due time and the clock, from which the
-- relay moves the floor.
WITH s AS MATERIALIZED (
    SELECT u.name, u.from_due, u.from_seq
      FROM unnest($1::text[], $3::boolean[], $5::timestamptz[], $6::bigint[]) WITH ORDINALITY AS u(name, ordered, from_due, from_seq, ord)
     WHERE EXISTS (SELECT 1 FROM /* TEMPLATE: schema */outbox_subscribers r
                    WHERE r.name = u.name AND r.retired_at IS NULL AND r.paused_at IS NULL)
       AND (NOT u.ordered OR pg_try_advisory_xact_lock($4::integer, hashtext(u.name)))
     ORDER BY u.ord)
SELECT d.seq, d.id, d.type, d.subject, d.scope, d.payload, d.created_at, d.attempts, d.trace_context, d.subscriber, d.next_attempt_at, now(), d.slot
  FROM s CROSS JOIN LATERAL (
       -- The event is read and locked with its pair, before the limit: a
       -- pair whose event is gone (deleted by hand) is left, not counted
       -- against the batch (it would take every round's share), and so is
       -- one whose event another round holds (SKIP LOCKED), so that a claim
       -- that comes back short has read its range to the end.
       SELECT e.seq, e.id, e.type, e.subject, e.scope, e.payload, e.created_at, e.trace_context, e.slot,
              p.subscriber, p.attempts, p.next_attempt_at
         FROM /* TEMPLATE: schema */outbox_deliveries p
         JOIN /* TEMPLATE: schema */outbox_events e ON e.seq = p.event_seq
        WHERE p.subscriber = s.name AND p.poisoned_at IS NULL AND p.next_attempt_at <= now()
          AND (p.next_attempt_at, p.event_seq) >= (s.from_due, s.from_seq)
        ORDER BY p.next_attempt_at, p.event_seq LIMIT $2
          FOR UPDATE OF p, e SKIP LOCKED) d
 LIMIT $2;

-- name: ClaimOwedOne
-- As ClaimOwed, for the event $2 only, from the start.
SELECT e.seq, e.id, e.type, e.subject, e.scope, e.payload, e.created_at, d.attempts, e.trace_context, d.subscriber, d.next_attempt_at, now(), e.slot
  FROM /* TEMPLATE: schema */outbox_deliveries d JOIN /* TEMPLATE: schema */outbox_events e ON e.seq = d.event_seq
 WHERE d.subscriber = ANY($1::text[]) AND d.poisoned_at IS NULL AND d.next_attempt_at <= now()
   AND EXISTS (SELECT 1 FROM /* TEMPLATE: schema */outbox_subscribers s
                WHERE s.name = d.subscriber AND s.retired_at IS NULL AND s.paused_at IS NULL)
   AND d.event_seq = $2
   FOR UPDATE OF d, e SKIP LOCKED;

-- name: StampOwed
-- The deliveries lane's stamp: the events' fanouts extended by the new jobs
-- ($1 seqs, $2 fanout documents, $5 the events' slots, so that each row's
-- partition is probed, not all ten) and the pairs served ($3 seqs, $4
-- subscribers) deleted, in the round's transaction.
WITH f AS (
    UPDATE /* TEMPLATE: schema */outbox_events AS e
       SET fanout = coalesce(e.fanout, '{}') || u.fanout::jsonb
      FROM unnest($1::bigint[], $2::text[], $5::smallint[]) AS u(seq, fanout, slot)
     WHERE e.seq = u.seq AND e.slot = u.slot)
DELETE FROM /* TEMPLATE: schema */outbox_deliveries AS d
 USING unnest($3::bigint[], $4::text[]) AS p(seq, sub)
 WHERE d.event_seq = p.seq AND d.subscriber = p.sub;

-- name: ChargeDeliveries
-- A failed attempt of pairs ($1 seqs, $2 subscribers, $3 errors, $4 pauses
-- in µs, $5 MaxAttempts): the first one writes the owed pair, a later one
-- counts up; the last is poisoned, and announced on the fanned channel for
-- the receipts. The error joins the pair's history of its last 10. Pairs of
-- a subscriber retired meanwhile are not written (its registry row is read
-- FOR KEY SHARE, as in Stamp).
WITH reg AS (
    SELECT name FROM /* TEMPLATE: schema */outbox_subscribers
     WHERE name = ANY($2::text[]) AND retired_at IS NULL
       FOR KEY SHARE),
c AS (
    INSERT INTO /* TEMPLATE: schema */outbox_deliveries AS d
           (event_seq, subscriber, attempts, next_attempt_at, poisoned_at, last_error, errors)
    SELECT u.seq, u.sub, 1, now() + u.delay * interval '1 microsecond', CASE WHEN 1 >= $5 THEN now() END, u.err,
           jsonb_build_array(jsonb_build_object('at', now(), 'error', u.err))
      FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[]) AS u(seq, sub, err, delay) JOIN reg ON reg.name = u.sub
    ON CONFLICT (event_seq, subscriber) DO UPDATE
       SET attempts = d.attempts + 1, next_attempt_at = EXCLUDED.next_attempt_at,
           poisoned_at = CASE WHEN d.attempts + 1 >= $5 THEN now() END, last_error = EXCLUDED.last_error,
           errors = (SELECT jsonb_agg(x ORDER BY n)
                       FROM (SELECT x, n FROM jsonb_array_elements(d.errors || EXCLUDED.errors)
                             WITH ORDINALITY AS a(x, n) ORDER BY n DESC LIMIT 10) h)
    RETURNING event_seq, subscriber, poisoned_at IS NOT NULL AS poisoned)
SELECT c.event_seq, c.subscriber, c.poisoned,
       CASE WHEN c.poisoned THEN pg_notify(/* TEMPLATE_BEGIN: channel_fanned */'standmeet_events_fanned'/* TEMPLATE_END */,
                                           (SELECT id::text FROM /* TEMPLATE: schema */outbox_events WHERE seq = c.event_seq)) END
  FROM c;

-- Pairs for operators. Requeue and Discard of one event, or of its pair
-- of one subscriber, are in admin.sql.

-- name: DeliveriesOf
-- $1 the event's seq.
SELECT e.seq, e.id, e.type, e.subject, d.subscriber, d.attempts, d.last_error, d.errors, d.next_attempt_at, d.poisoned_at, d.created_at
  FROM /* TEMPLATE: schema */outbox_deliveries d JOIN /* TEMPLATE: schema */outbox_events e ON e.seq = d.event_seq
 WHERE d.event_seq = $1
 ORDER BY d.subscriber;

-- name: ListDeliveries
-- $1 limit, $2 'owed' or 'poisoned', $3 type regexp or NULL, $4 subscriber
-- or NULL, $5 and $6 the cursor (seq, subscriber) or NULL, $7 event IDs or
-- NULL.
SELECT e.seq, e.id, e.type, e.subject, d.subscriber, d.attempts, d.last_error, d.errors, d.next_attempt_at, d.poisoned_at, d.created_at
  FROM /* TEMPLATE: schema */outbox_deliveries d JOIN /* TEMPLATE: schema */outbox_events e ON e.seq = d.event_seq
 WHERE (d.poisoned_at IS NOT NULL) = ($2 = 'poisoned')
   AND ($3::text IS NULL OR ('.' || e.type) ~ $3) AND ($4::text IS NULL OR d.subscriber = $4)
   AND ($5::bigint IS NULL OR (d.event_seq, d.subscriber) > ($5, $6::text))
   AND ($7::uuid[] IS NULL OR e.id = ANY($7))
 ORDER BY d.event_seq, d.subscriber LIMIT $1;

-- By filter, a batch at a time: $1 type regexp or NULL, $2 subscriber or
-- NULL, $3 batch size.

-- name: RequeueDeliveries
WITH q AS (
    UPDATE /* TEMPLATE: schema */outbox_deliveries SET poisoned_at = NULL, attempts = 0, next_attempt_at = now()
     WHERE (event_seq, subscriber) IN (
           SELECT d.event_seq, d.subscriber
             FROM /* TEMPLATE: schema */outbox_deliveries d JOIN /* TEMPLATE: schema */outbox_events e ON e.seq = d.event_seq
            WHERE d.poisoned_at IS NOT NULL AND ($1::text IS NULL OR ('.' || e.type) ~ $1) AND ($2::text IS NULL OR d.subscriber = $2)
            LIMIT $3 FOR UPDATE OF d SKIP LOCKED)
    RETURNING 1)
SELECT count(*), (SELECT pg_notify(/* TEMPLATE_BEGIN: channel_events */'standmeet_events'/* TEMPLATE_END */, '')) FROM q;

-- name: DiscardDeliveries
WITH q AS (
    DELETE FROM /* TEMPLATE: schema */outbox_deliveries
     WHERE (event_seq, subscriber) IN (
           SELECT d.event_seq, d.subscriber
             FROM /* TEMPLATE: schema */outbox_deliveries d JOIN /* TEMPLATE: schema */outbox_events e ON e.seq = d.event_seq
            WHERE d.poisoned_at IS NOT NULL AND ($1::text IS NULL OR ('.' || e.type) ~ $1) AND ($2::text IS NULL OR d.subscriber = $2)
            LIMIT $3 FOR UPDATE OF d SKIP LOCKED)
    RETURNING 1)
SELECT count(*) FROM q;
