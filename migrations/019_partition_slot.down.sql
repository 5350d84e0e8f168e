-- Back to version 018.
ALTER TABLE outbox_events DROP CONSTRAINT IF EXISTS outbox_events_legacy_slot;
ALTER TABLE outbox_events DROP COLUMN IF EXISTS slot;
