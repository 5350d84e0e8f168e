-- The relay's pending lane: events not yet fanned out, claimed FOR UPDATE
-- SKIP LOCKED, mapped, and stamped in the round's transaction.
--
-- Every claim returns the same columns (scanClaimed): the event, its
-- attempts and trace context, and paused, read once per claim (an InitPlan
-- on the small registry): the subscribers an operator paused, for which the
-- round maps nothing and the stamp leaves the pairs owed.
--
-- Never "seq > cursor": a row whose transaction commits late has a lower seq
-- than rows already fanned out, and must still be found. A claim floor is
-- not a cursor: it is a transaction ID that was still running, and every row
-- that commits later was recorded by a transaction that was running too
-- (see claimFloor). Rows that failed before wait for their retry time in
-- ClaimDue.

-- name: ClaimBatch
-- $1 batch size: a claim from the start, in seq order (a relay's first, and
-- its full rescans: see claimFloor). Under a held snapshot it steps over
-- the dead index entries of every event fanned out since; ClaimFrom does
-- not.
SELECT seq, id, type, subject, scope, payload, created_at, attempts, trace_context, slot,
       (SELECT array_agg(name) FROM /* TEMPLATE: schema */outbox_subscribers
         WHERE paused_at IS NOT NULL AND retired_at IS NULL) AS paused
  FROM /* TEMPLATE: schema */outbox_events
 WHERE fanned_out_at IS NULL AND poisoned_at IS NULL AND attempts = 0
 ORDER BY seq LIMIT $1
   FOR UPDATE SKIP LOCKED;

-- name: ClaimFrom
-- $1 batch size, $2 and $3 the claim floor (a transaction, and the seq its
-- rows start after), $4 the transactions below it still running at the
-- floor's claim: the pending events recorded by one of $4, or at or above
-- the floor (and requeued since), claimed by outbox_claim_from in the
-- order of outbox_events_claim_floor_idx, which starts the scan at the
-- floor rather than at the oldest dead entry (the functions, 018's
-- outbox_claim_from and 020's outbox_claim_rows, which adds the slot, say
-- why it is one, and why it returns the rows it locked). The round sorts its batch
-- by seq; claimed_xid tells the relay how far the claim got.
SELECT c.seq, c.id, c.type, c.subject, c.scope, c.payload, c.created_at, c.attempts, c.trace_context, c.slot,
       (SELECT array_agg(name) FROM /* TEMPLATE: schema */outbox_subscribers
         WHERE paused_at IS NOT NULL AND retired_at IS NULL) AS paused,
       c.xact_id::text::bigint AS claimed_xid
  FROM /* TEMPLATE: schema */outbox_claim_rows($2::bigint::text::xid8, $3::bigint, $4::bigint[]::text[]::xid8[], $1::integer) c;

-- name: PendingBelow
-- $1, $2, $3, $4, $5: the first transaction from $1 up to (not including)
-- $2, or $2's own up to seq $3, or one of $4, and not one of $5 (which the
-- claims read), of a pending row that no round holds, or NULL (see
-- claimfloor).
SELECT /* TEMPLATE: schema */outbox_pending_below($1::bigint::text::xid8, $2::bigint::text::xid8, $3::bigint,
                                                  $4::bigint[]::text[]::xid8[], $5::bigint[]::text[]::xid8[])::text::bigint;

-- name: ClaimOne
-- $1 seq.
SELECT seq, id, type, subject, scope, payload, created_at, attempts, trace_context, slot,
       (SELECT array_agg(name) FROM /* TEMPLATE: schema */outbox_subscribers
         WHERE paused_at IS NOT NULL AND retired_at IS NULL) AS paused
  FROM /* TEMPLATE: schema */outbox_events
 WHERE fanned_out_at IS NULL AND poisoned_at IS NULL AND seq = $1
   FOR UPDATE SKIP LOCKED;

-- name: ClaimDue
-- $1 batch size: failed events whose retry is due, claimed by
-- outbox_claim_due through the retry index (the function says why).
SELECT e.seq, e.id, e.type, e.subject, e.scope, e.payload, e.created_at, e.attempts, e.trace_context, e.slot,
       (SELECT array_agg(name) FROM /* TEMPLATE: schema */outbox_subscribers
         WHERE paused_at IS NOT NULL AND retired_at IS NULL) AS paused
  FROM /* TEMPLATE: schema */outbox_claim_due($1::integer) c
  JOIN /* TEMPLATE: schema */outbox_events e ON e.seq = c.seq
 ORDER BY e.seq;

-- name: Load
-- $1 seq: a claimed event read again, unlocked.
SELECT seq, id, type, subject, scope, payload, created_at, attempts, trace_context, slot,
       (SELECT array_agg(name) FROM /* TEMPLATE: schema */outbox_subscribers
         WHERE paused_at IS NOT NULL AND retired_at IS NULL) AS paused
  FROM /* TEMPLATE: schema */outbox_events
 WHERE seq = $1;

-- name: Poll
-- One query tells an idle relay both whether new rows wait in its claim
-- floor $2, $3, $4 (a notification may have been throttled or lost; below the
-- floor, its looks below look; outbox_pending_from starts at the floor in
-- outbox_events_claim_floor_idx) and when the next failed event or owed
-- pair of its subscribers $1 is due; each through a small partial index
-- (failed events: outbox_retry_next; owed pairs: the first entry of each
-- active subscriber's range of the claim index from its floor $5[i], $6[i]
-- (package owedfloor), so neither a backlog nor the pairs served under a
-- held snapshot cost anything here), the oldest transaction running (a
-- failover, see claimfloor) and
-- when the server started (a restart, which a relay without a listener may
-- not otherwise notice: the pool replaces dead connections quietly).
SELECT /* TEMPLATE: schema */outbox_pending_from($2::bigint::text::xid8, $3::bigint, $4::bigint[]::text[]::xid8[]),
       extract(epoch FROM least(
           /* TEMPLATE: schema */outbox_retry_next(),
           (SELECT min(d.next_attempt_at)
              FROM unnest($1::text[], $5::timestamptz[], $6::bigint[]) AS u(name, from_due, from_seq)
             CROSS JOIN LATERAL (
                   SELECT p.next_attempt_at FROM /* TEMPLATE: schema */outbox_deliveries p
                    WHERE p.subscriber = u.name AND p.poisoned_at IS NULL
                      AND (p.next_attempt_at, p.event_seq) >= (u.from_due, u.from_seq)
                    ORDER BY p.next_attempt_at, p.event_seq LIMIT 1) d
             WHERE u.name NOT IN (SELECT name FROM /* TEMPLATE: schema */outbox_subscribers
                                   WHERE paused_at IS NOT NULL OR retired_at IS NOT NULL))) - now()),
       pg_snapshot_xmin(pg_current_snapshot())::text::bigint, pg_postmaster_start_time();

-- name: Stamp
-- $1 seqs, $2 their fanout documents, $3 the subscribers the round served,
-- $4 the rows' slots: the events fanned out, and owed to every other active
-- registered subscriber whose types match (outbox_stamp, 021, says how; a
-- function, so that its plan is kept, generic, for the session).
SELECT /* TEMPLATE: schema */outbox_stamp($1::bigint[], $2::text[], $3::text[], $4::smallint[]);

-- name: NewestJobs
-- $1 how many, $2 the ID they are below: River's newest jobs this
-- transaction sees, newest first, and whether this transaction wrote each
-- (a round's COPY insert, River's InsertManyFastTx, returns no IDs:
-- insertCopied finds them here; nothing in a round writes river_job before
-- its insert). An index scan of river_job's primary key from $2 down,
-- whatever the table holds.
SELECT id, kind, xmin = pg_current_xact_id()::xid AS ours
  FROM /* TEMPLATE: schema */river_job
 WHERE id < $2
 ORDER BY id DESC LIMIT $1;

-- name: Charge
-- A failed attempt of a whole event ($1 seq, $2 error, $3 pause in µs, $4
-- MaxAttempts), poisoning the row at the last one: a failure no
-- subscriber's pair could be blamed for (its stamp failed). A poisoning is
-- announced on the fanned channel too: receipts waiting for the event must
-- learn it will not be fanned out.
WITH c AS (
    UPDATE /* TEMPLATE: schema */outbox_events
       SET attempts = attempts + 1, last_error = $2, next_attempt_at = now() + $3::bigint * interval '1 microsecond',
           poisoned_at = CASE WHEN attempts + 1 >= $4 THEN now() END
     WHERE seq = $1 AND fanned_out_at IS NULL AND poisoned_at IS NULL
    RETURNING id, poisoned_at IS NOT NULL AS poisoned)
SELECT poisoned,
       CASE WHEN poisoned THEN pg_notify(/* TEMPLATE_BEGIN: channel_fanned */'standmeet_events_fanned'/* TEMPLATE_END */, id::text) END
  FROM c;

-- name: ConvertCatchUp
-- $1 batch size: catch_up lists written by 0.1.0 relays become owed pairs.
SELECT /* TEMPLATE: schema */outbox_convert_catch_up($1);

-- name: NotifyFanned
-- $1 the IDs fanned out, for the receipts.
SELECT pg_notify(/* TEMPLATE_BEGIN: channel_fanned */'standmeet_events_fanned'/* TEMPLATE_END */, $1);

-- name: NotifyEvents
-- Wakes the relays, outside any host transaction (an awaiter's kick).
SELECT pg_notify(/* TEMPLATE_BEGIN: channel_events */'standmeet_events'/* TEMPLATE_END */, '');
