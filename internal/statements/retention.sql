-- Retention, run by the relays outside any host transaction.

-- name: PruneLock
-- $1 the lock's class, $2 the schema: one relay of the schema prunes at a
-- time, without a leader.
SELECT pg_try_advisory_xact_lock($1, hashtext($2));

-- name: Prune
-- Deletes up to $2 fanned-out rows older than $1 µs that owe nothing:
-- neither a pair nor a catch_up list (0.1.0's) left. Joined on seq and
-- slot, in a nested loop (the caller turns hash and merge joins off), each
-- row's probe goes to its partition alone rather than to all ten.
WITH doomed AS MATERIALIZED (
    SELECT seq, slot FROM /* TEMPLATE: schema */outbox_events e
     WHERE fanned_out_at < now() - $1::bigint * interval '1 microsecond'
       AND fanned_out_at IS NOT NULL AND poisoned_at IS NULL AND catch_up IS NULL
       AND NOT EXISTS (SELECT 1 FROM /* TEMPLATE: schema */outbox_deliveries d WHERE d.event_seq = e.seq)
     ORDER BY fanned_out_at LIMIT $2
       FOR UPDATE SKIP LOCKED)
DELETE FROM /* TEMPLATE: schema */outbox_events e USING doomed d WHERE e.seq = d.seq AND e.slot = d.slot;

-- name: ExpiredPartitions
-- $1 the retention in µs: the partitions of outbox_events whose rows have
-- all expired, looked at without a lock (outbox_expired_partitions), as
-- names to give TruncateExpired.
SELECT p::text FROM /* TEMPLATE: schema */outbox_expired_partitions($1::bigint) AS p;

-- name: TruncateExpired
-- $1 a partition, $2 the retention in µs: emptied with TRUNCATE if all of
-- its rows have still expired under an exclusive lock on it, taken NOWAIT
-- (outbox_truncate_expired): lock_not_available when anyone holds a lock
-- on it.
SELECT /* TEMPLATE: schema */outbox_truncate_expired($1::regclass, $2::bigint);
