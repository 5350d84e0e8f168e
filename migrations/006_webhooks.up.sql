-- An optional scope per event (such as "tenant:42"): webhook endpoints
-- receive only the scopes they list.
ALTER TABLE outbox_events ADD COLUMN scope text NOT NULL DEFAULT '';
ALTER TABLE outbox_events ADD CONSTRAINT outbox_events_scope_check CHECK (length(scope) <= 255);

-- outbox_record takes a scope too.
DROP FUNCTION IF EXISTS outbox_record(text, text, jsonb);
CREATE FUNCTION outbox_record(event_type text, event_subject text DEFAULT '', event_payload jsonb DEFAULT '{}', event_scope text DEFAULT '')
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
    INSERT INTO outbox_events (id, type, subject, payload, scope)
    VALUES (new_id, event_type, coalesce(event_subject, ''), coalesce(event_payload, '{}'), coalesce(event_scope, ''));
    PERFORM outbox_notify();
    RETURN new_id;
END
$$;

-- The trigger function behind events.InstallWatch, with a scope. Arguments:
--   0 event type, 1 subject prefix, 2 subject column ('' for none),
--   3 payload mode ('none', 'row', 'old_new' or 'columns'),
--   4 scope prefix, 5 scope column ('' for none), 6… payload columns.
-- It runs for every written row, so it calls as little as it can: the
-- UUIDv7 is built inline (as outbox_uuidv7 does), and outbox_notify is
-- called only when the throttle's interval has passed.
CREATE OR REPLACE FUNCTION outbox_watch()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    rec     jsonb;
    payload jsonb   := '{}';
    subject text    := TG_ARGV[1];
    scope   text    := TG_ARGV[4];
    ms      numeric := extract(epoch FROM clock_timestamp()) * 1000;
    frac    integer := floor((ms - floor(ms)) * 4096);
BEGIN
    IF TG_ARGV[3] <> 'none' OR TG_ARGV[2] <> '' OR TG_ARGV[5] <> '' THEN
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
              FROM unnest(TG_ARGV[6:TG_NARGS - 1]) AS c;
    END CASE;
    IF TG_ARGV[2] <> '' THEN
        subject := subject || coalesce(rec ->> TG_ARGV[2], '');
    END IF;
    IF TG_ARGV[5] <> '' THEN
        scope := scope || coalesce(rec ->> TG_ARGV[5], '');
    END IF;
    INSERT INTO outbox_events (id, type, subject, payload, scope)
    VALUES (encode(set_byte(set_byte(
                overlay(uuid_send(gen_random_uuid()) PLACING substring(int8send(floor(ms)::bigint) FROM 3) FROM 1 FOR 6),
                6, 112 | (frac >> 8)), 7, frac & 255), 'hex')::uuid,
            TG_ARGV[0], subject, payload, scope);
    IF NOT EXISTS (SELECT 1 FROM outbox_settings
                    WHERE notify_interval < interval '0' OR notified_at > clock_timestamp() - notify_interval) THEN
        PERFORM outbox_notify();
    END IF;
    RETURN NULL;
END
$$;

-- Webhook endpoints (package webhook).
CREATE TABLE webhook_endpoints (
    id               uuid        PRIMARY KEY,
    url              text        NOT NULL,
    description      text        NOT NULL DEFAULT '',
    types            text[]      NOT NULL,
    scopes           text[]      NOT NULL DEFAULT '{}',
    headers          jsonb       NOT NULL DEFAULT '{}',
    -- [{"secret": "whsec_…", "expires_at": null | timestamp}]: every
    -- unexpired secret signs (rotation).
    secrets          jsonb       NOT NULL,
    timeout_ms       integer     NOT NULL,
    max_in_flight    integer     NOT NULL,
    enabled          boolean     NOT NULL DEFAULT true,
    disabled_reason  text,
    disabled_at      timestamptz,
    -- The first failure since the last success: the auto-disable window.
    failing_since    timestamptz,
    last_success_at  timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_endpoints_enabled_idx ON webhook_endpoints (id) WHERE enabled;

-- Every delivery attempt.
CREATE TABLE webhook_attempts (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id  uuid        NOT NULL,
    event_id     uuid        NOT NULL,
    attempt      integer     NOT NULL,
    status       integer     NOT NULL DEFAULT 0,  -- HTTP status; 0 when no answer
    error_class  text        NOT NULL DEFAULT '', -- '' on success
    error        text        NOT NULL DEFAULT '',
    duration_ms  integer     NOT NULL,
    dialed_ip    text        NOT NULL DEFAULT '',
    response     text        NOT NULL DEFAULT '',  -- the body, capped
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_attempts_endpoint_idx ON webhook_attempts (endpoint_id, created_at DESC, id DESC);
CREATE INDEX webhook_attempts_event_idx ON webhook_attempts (event_id, created_at DESC);
CREATE INDEX webhook_attempts_created_idx ON webhook_attempts (created_at);
