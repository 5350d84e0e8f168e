-- The transaction that recorded each event, so a writer can find the events
-- its transaction made, including those made by triggers (events.RecordedInTx).
-- pg_current_xact_id() is the top-level transaction's ID, also inside
-- savepoints.
ALTER TABLE outbox_events ADD COLUMN xact_id xid8 NOT NULL DEFAULT pg_current_xact_id();

-- Records an event from any SQL, in the calling transaction, and wakes the
-- relays when that transaction commits, exactly like events.Record. Returns
-- the event's ID. search_path is pinned to the schema the function was
-- created in, so it finds its table whatever the caller's search_path.
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

-- The trigger function behind events.InstallWatch. Arguments:
--   0 event type, 1 subject prefix, 2 subject column ('' for none),
--   3 payload mode ('none', 'row', 'old_new' or 'columns'),
--   4… payload columns (mode 'columns').
-- Which rows fire is decided by the trigger's own WHEN clause.
CREATE FUNCTION outbox_watch()
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
