-- Version 0.1.0 of the library's schema, on top of the outbox (001) and the
-- watch triggers (002): the subscriber registry and the catch-up lane of
-- rolling deploys, UUIDv7 for SQL-made events, the settings row with the
-- schema's channel and the notify throttle, trace context, retention's
-- index and vacuum settings, event scopes, and the webhook tables.

-- Subscribers that exist, and since when. A relay registers the subscribers
-- it knows when it starts. During a rolling deploy, relays with different
-- subscriber sets run side by side: a relay that stamps an event marks, in
-- catch_up, the registered subscribers it does not know, and a relay that
-- knows one of them fans the event out to it later (the catch-up lane).
CREATE TABLE outbox_subscribers (
    name          text        PRIMARY KEY,
    registered_at timestamptz NOT NULL DEFAULT now(),
    -- Set by events.RetireSubscriber: no relay fans out to it or catches up
    -- for it any more.
    retired_at    timestamptz
);

-- Registered subscribers the stamping relay did not know: each still has to
-- receive this event (if it matches). NULL when none.
ALTER TABLE outbox_events ADD COLUMN catch_up text[];

-- The catch-up lane: a relay asks for the rows naming any subscriber it
-- knows (catch_up && ARRAY[...]). A GIN index, so rows waiting for a
-- subscriber that no running relay knows are never read again.
CREATE INDEX outbox_events_catch_up_idx ON outbox_events USING gin (catch_up)
    WHERE catch_up IS NOT NULL;

-- A version-7 UUID (RFC 9562): 48 bits of Unix milliseconds, then 12 bits of
-- the sub-millisecond fraction (method 3, so IDs made in one session sort by
-- time to the microsecond), then random bits. PostgreSQL 15 has no uuidv7().
CREATE FUNCTION outbox_uuidv7()
RETURNS uuid
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    ms    numeric := extract(epoch FROM clock_timestamp()) * 1000;
    whole bigint  := floor(ms);
    frac  integer := floor((ms - whole) * 4096);
    b     bytea   := uuid_send(gen_random_uuid());
BEGIN
    b := overlay(b PLACING substring(int8send(whole) FROM 3) FROM 1 FOR 6);
    b := set_byte(b, 6, 112 | (frac >> 8)); -- version 7 in the high nibble
    b := set_byte(b, 7, frac & 255);
    RETURN encode(b, 'hex')::uuid;          -- variant bits come from v4
END
$$;

-- One row of settings that the SQL functions read and the notify throttle
-- they share.
--
-- channel is the schema's notification channel: events.Migrate writes
-- "<schema>.standmeet_events" when given a schema (River qualifies its
-- channels the same way); a team running these files with its own tool in a
-- named schema sets it likewise.
--
-- A transaction that has run pg_notify takes a cluster-wide lock at commit
-- (PreCommit_Notify) and holds it through its WAL flush, so notifying in
-- every writing transaction serialises every such commit in the cluster.
-- outbox_record (and so every watch trigger) notifies only when
-- notify_interval has passed since notified_at and it wins the row with
-- FOR UPDATE SKIP LOCKED, which never waits: at most about one notifying
-- transaction per interval, cluster-wide. The others rely on the relays'
-- trailing re-check and polling. notify_interval 0 notifies in every
-- transaction; a negative one never.
CREATE TABLE outbox_settings (
    id              boolean     PRIMARY KEY DEFAULT true CHECK (id),
    channel         text        NOT NULL DEFAULT 'standmeet_events',
    notify_interval interval    NOT NULL DEFAULT '10 milliseconds',
    notified_at     timestamptz NOT NULL DEFAULT '-infinity'
) WITH (fillfactor = 50); -- room for HOT updates of notified_at
INSERT INTO outbox_settings DEFAULT VALUES;

-- Notifies the relays, throttled as described above.
CREATE FUNCTION outbox_notify()
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    s outbox_settings%ROWTYPE;
BEGIN
    SELECT * INTO s FROM outbox_settings;
    IF s.notify_interval < interval '0' OR s.notified_at > clock_timestamp() - s.notify_interval THEN
        RETURN;
    END IF;
    IF s.notify_interval > interval '0' THEN
        -- Claim the right to notify; skip if another transaction holds it.
        PERFORM 1 FROM outbox_settings
         WHERE notified_at <= clock_timestamp() - notify_interval
           FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        UPDATE outbox_settings SET notified_at = clock_timestamp();
    END IF;
    PERFORM pg_notify(s.channel, '');
END
$$;

-- W3C trace context of the request that recorded the event
-- ({"traceparent": …, "tracestate": …}), copied into the metadata of its
-- jobs. NULL when the recording context had no span: such events cost
-- nothing more.
ALTER TABLE outbox_events ADD COLUMN trace_context jsonb;

-- Fanned-out rows by fan-out time: what retention deletes, oldest first, and
-- what Stats counts as fanned out in the last minute.
CREATE INDEX outbox_events_fanned_idx ON outbox_events (fanned_out_at)
    WHERE fanned_out_at IS NOT NULL AND poisoned_at IS NULL;

-- The stamp UPDATE changes indexed columns, so it is never a HOT update:
-- every fan-out leaves a dead row version, and retention deletes many rows.
-- Vacuum this table more eagerly than the defaults (which wait for 20% of
-- the table to be dead).
ALTER TABLE outbox_events SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.05,
    autovacuum_vacuum_cost_limit = 2000
);

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
