-- Recording, in the host's transaction: with the relays' notification, and
-- without (the transaction's notification was throttled). The NOTIFY rides
-- on the INSERT: one round trip. Its payload is constant, so PostgreSQL
-- folds a transaction's notifies into one.
--
-- $1 id, $2 type, $3 subject, $4 payload, $5 trace context, $6 scope; the
-- many-row forms take $1 to $4 and $6 as text[] (every query exec mode can
-- encode them), one trace context for all.

-- name: Record
INSERT INTO /* TEMPLATE: schema */outbox_events (id, type, subject, payload, trace_context, scope)
VALUES ($1, $2, $3, $4::text::jsonb, $5::text::jsonb, $6)
RETURNING seq, created_at;

-- name: RecordNotify
WITH ins AS (
    INSERT INTO /* TEMPLATE: schema */outbox_events (id, type, subject, payload, trace_context, scope)
    VALUES ($1, $2, $3, $4::text::jsonb, $5::text::jsonb, $6)
    RETURNING seq, created_at)
SELECT seq, created_at
  FROM ins, (SELECT pg_notify(/* TEMPLATE_BEGIN: channel_events */'standmeet_events'/* TEMPLATE_END */, '')) n;

-- name: RecordMany
-- RETURNING order is not promised, so the caller matches rows back by ID.
INSERT INTO /* TEMPLATE: schema */outbox_events (id, type, subject, payload, trace_context, scope)
SELECT id::uuid, type, subject, payload::jsonb, $5::text::jsonb, scope
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $6::text[]) AS u(id, type, subject, payload, scope)
RETURNING id, seq, created_at;

-- name: RecordManyNotify
-- The NOTIFY sits in a materialised CTE so it runs once, not once per row.
WITH notify AS MATERIALIZED (
    SELECT pg_notify(/* TEMPLATE_BEGIN: channel_events */'standmeet_events'/* TEMPLATE_END */, '')),
ins AS (
    INSERT INTO /* TEMPLATE: schema */outbox_events (id, type, subject, payload, trace_context, scope)
    SELECT id::uuid, type, subject, payload::jsonb, $5::text::jsonb, scope
      FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $6::text[]) AS u(id, type, subject, payload, scope)
    RETURNING id, seq, created_at)
SELECT ins.id, ins.seq, ins.created_at FROM ins CROSS JOIN notify;

-- name: RecordedInTx
-- The transaction's own events (migration 014): under SERIALIZABLE from the
-- session's temporary notes, which take no predicate locks; otherwise its
-- pending rows, through the relay's index.
SELECT seq, id, type, subject, scope, payload, created_at FROM /* TEMPLATE: schema */outbox_recorded_in_tx();
