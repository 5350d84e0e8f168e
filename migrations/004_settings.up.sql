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
    PERFORM outbox_notify();
    RETURN new_id;
END
$$;

-- The trigger function behind events.InstallWatch, as in 002, but inserting
-- directly: the event type was checked when the watch was installed, so the
-- per-row validation of outbox_record is skipped, and the row is only turned
-- into JSON when the payload or the subject needs it.
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
