DROP FUNCTION IF EXISTS outbox_watch() CASCADE;
DROP FUNCTION IF EXISTS outbox_record(text, text, jsonb);
ALTER TABLE outbox_events DROP COLUMN IF EXISTS xact_id;
