DROP TABLE IF EXISTS webhook_attempts;
DROP TABLE IF EXISTS webhook_endpoints;
DROP FUNCTION IF EXISTS outbox_record(text, text, jsonb, text);
CREATE FUNCTION outbox_record(event_type text, event_subject text DEFAULT '', event_payload jsonb DEFAULT '{}')
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
    PERFORM outbox_notify();
    RETURN new_id;
END
$$;
CREATE OR REPLACE FUNCTION outbox_watch()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    rec     jsonb;
    payload jsonb := '{}';
    subject text  := TG_ARGV[1];
BEGIN
    IF TG_ARGV[3] <> 'none' OR TG_ARGV[2] <> '' THEN
        IF TG_OP = 'DELETE' THEN
            rec := to_jsonb(OLD);
        ELSE
            rec := to_jsonb(NEW);
        END IF;
    END IF;
    CASE TG_ARGV[3]
        WHEN 'none' THEN
            NULL;
        WHEN 'row' THEN
            payload := rec;
        WHEN 'old_new' THEN
            payload := jsonb_build_object(
                'old', CASE WHEN TG_OP = 'INSERT' THEN NULL ELSE to_jsonb(OLD) END,
                'new', CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE to_jsonb(NEW) END);
        ELSE
            SELECT coalesce(jsonb_object_agg(c, rec -> c), '{}') INTO payload
              FROM unnest(TG_ARGV[4:TG_NARGS - 1]) AS c;
    END CASE;
    IF TG_ARGV[2] <> '' THEN
        subject := subject || coalesce(rec ->> TG_ARGV[2], '');
    END IF;
    INSERT INTO outbox_events (id, type, subject, payload)
    VALUES (outbox_uuidv7(), TG_ARGV[0], subject, payload);
    PERFORM outbox_notify();
    RETURN NULL;
END
$$;
ALTER TABLE outbox_events DROP CONSTRAINT IF EXISTS outbox_events_scope_check;
ALTER TABLE outbox_events DROP COLUMN IF EXISTS scope;
