-- Back to version 015: no claims from a floor.
DROP FUNCTION IF EXISTS outbox_claim_due(integer);
DROP FUNCTION IF EXISTS outbox_retry_next();
DROP FUNCTION IF EXISTS outbox_pending_below(xid8, xid8);
DROP FUNCTION IF EXISTS outbox_pending_from(xid8);
DROP FUNCTION IF EXISTS outbox_claim_from(xid8, integer);
ALTER TABLE outbox_relays DROP COLUMN IF EXISTS claim_floor;
