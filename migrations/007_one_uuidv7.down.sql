-- Back to version 006: the watch trigger builds its UUIDv7 inline again, as
-- migration 004 left it.
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
    -- outbox_uuidv7(), inline: this runs for every written row.
    INSERT INTO outbox_events (id, type, subject, payload, scope)
    VALUES (encode(set_byte(set_byte(
                overlay(uuid_send(gen_random_uuid()) PLACING substring(int8send(floor(ms)::bigint) FROM 3) FROM 1 FOR 6),
                6, 112 | (frac >> 8)), 7, frac & 255), 'hex')::uuid,
            TG_ARGV[0], subject, payload, scope);
    PERFORM outbox_notify();
    RETURN NULL;
END
$$;
