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
    PERFORM pg_notify('standmeet_events', '');
    RETURN new_id;
END
$$;
DROP FUNCTION IF EXISTS outbox_notify();
DROP TABLE IF EXISTS outbox_settings;
