-- Back to version 016: no claim floor index (ClaimFrom reads the pending
-- index).
DROP INDEX IF EXISTS outbox_events_claim_floor_idx;
