-- Back to version 017: floors without the running transactions below them.
DROP FUNCTION IF EXISTS outbox_pending_below(xid8, xid8, bigint, xid8[], xid8[]);
DROP FUNCTION IF EXISTS outbox_pending_from(xid8, bigint, xid8[]);
DROP FUNCTION IF EXISTS outbox_claim_from(xid8, bigint, xid8[], integer);
