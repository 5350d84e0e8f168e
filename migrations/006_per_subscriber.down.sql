-- Back to version 005 (or 004): the per-pair state goes. Owed pairs that are
-- not poisoned go back into their events' catch_up lists, where 0.1.0's
-- relays serve them; poisoned pairs are lost with the table.
UPDATE outbox_events e SET catch_up = p.names
  FROM (SELECT event_seq, array_agg(subscriber ORDER BY subscriber) AS names
          FROM outbox_deliveries WHERE poisoned_at IS NULL GROUP BY event_seq) p
 WHERE e.seq = p.event_seq;
DROP FUNCTION IF EXISTS outbox_delivery_stats();
DROP FUNCTION IF EXISTS outbox_convert_catch_up(integer);
DROP TABLE IF EXISTS outbox_relays;
DROP TABLE IF EXISTS outbox_deliveries;
ALTER TABLE outbox_subscribers
    DROP COLUMN IF EXISTS types,
    DROP COLUMN IF EXISTS types_regexp,
    DROP COLUMN IF EXISTS last_served_at,
    DROP COLUMN IF EXISTS paused_at,
    DROP COLUMN IF EXISTS backfill_since,
    DROP COLUMN IF EXISTS backfill_seq,
    DROP COLUMN IF EXISTS backfill_done_at;
