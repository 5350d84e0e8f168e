-- Back to version 002: the webhook tables, scopes, trace context, settings,
-- registry and catch-up lane go, and outbox_record and outbox_watch are as
-- 002 made them.
DROP TABLE IF EXISTS webhook_attempts;
DROP TABLE IF EXISTS webhook_endpoints;
DROP FUNCTION IF EXISTS outbox_record(text, text, jsonb, text);
CREATE FUNCTION outbox_record(event_type text, event_subject text DEFAULT '', event_payload jsonb DEFAULT '{}')
RETURNS uuid
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    new_id uuid := gen_random_uuid();
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
CREATE OR REPLACE FUNCTION outbox_watch()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    rec     jsonb;
    payload jsonb;
BEGIN
    IF TG_OP = 'DELETE' THEN
        rec := to_jsonb(OLD);
    ELSE
        rec := to_jsonb(NEW);
    END IF;
    CASE TG_ARGV[3]
        WHEN 'none' THEN
            payload := '{}';
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
    PERFORM outbox_record(
        TG_ARGV[0],
        CASE WHEN TG_ARGV[2] = '' THEN TG_ARGV[1] ELSE TG_ARGV[1] || coalesce(rec ->> TG_ARGV[2], '') END,
        payload);
    RETURN NULL;
END
$$;
DROP FUNCTION IF EXISTS outbox_notify();
DROP TABLE IF EXISTS outbox_settings;
DROP FUNCTION IF EXISTS outbox_uuidv7();
ALTER TABLE outbox_events RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
    autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_limit);
DROP INDEX IF EXISTS outbox_events_fanned_idx;
DROP INDEX IF EXISTS outbox_events_catch_up_idx;
ALTER TABLE outbox_events DROP CONSTRAINT IF EXISTS outbox_events_scope_check;
ALTER TABLE outbox_events DROP COLUMN IF EXISTS scope;
ALTER TABLE outbox_events DROP COLUMN IF EXISTS trace_context;
ALTER TABLE outbox_events DROP COLUMN IF EXISTS catch_up;
DROP TABLE IF EXISTS outbox_subscribers;
