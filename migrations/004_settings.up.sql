-- One row of settings that the SQL functions read. channel is the schema's
-- notification channel: events.Migrate writes "<schema>.standmeet_events"
-- when given a schema (River qualifies its channels the same way); a team
-- running these files with its own tool in a named schema sets it likewise.
CREATE TABLE outbox_settings (
    id      boolean PRIMARY KEY DEFAULT true CHECK (id),
    channel text    NOT NULL DEFAULT 'standmeet_events'
);
INSERT INTO outbox_settings DEFAULT VALUES;

CREATE OR REPLACE FUNCTION outbox_record(event_type text, event_subject text DEFAULT '', event_payload jsonb DEFAULT '{}')
RETURNS uuid
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    new_id uuid := outbox_uuidv7();
BEGIN
    IF event_type IS NULL OR event_type !~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$' OR length(event_type) > 255 THEN
        RAISE EXCEPTION 'outbox_record: invalid event type %', quote_literal(coalesce(event_type, 'NULL'))
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO outbox_events (id, type, subject, payload)
    VALUES (new_id, event_type, coalesce(event_subject, ''), coalesce(event_payload, '{}'));
    PERFORM pg_notify((SELECT channel FROM outbox_settings), '');
    RETURN new_id;
END
$$;
