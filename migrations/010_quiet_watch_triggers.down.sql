-- Back to version 009: watch triggers notify, throttled, as 007 wrote them.
CREATE OR REPLACE FUNCTION outbox_watch()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    rec     jsonb;
    payload jsonb := '{}';
    subject text  := TG_ARGV[1];
    scope   text  := TG_ARGV[4];
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
    VALUES (outbox_uuidv7(), TG_ARGV[0], subject, payload, scope);
    PERFORM outbox_notify();
    RETURN NULL;
END
$$;

-- Each watch's own trigger function this role may replace, the same way
-- (see the up migration; E'' strings, too, read the same whatever
-- standard_conforming_strings says).
DO $do$
DECLARE
    f   oid;
    s   text;
    def text;
BEGIN
    FOR f, s IN
        SELECT p.oid, n.nspname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE p.proname ~ '^outbox_watch_[0-9a-f]{16}$'
           AND p.pronamespace = (SELECT pronamespace FROM pg_proc WHERE oid = 'outbox_watch()'::regprocedure)
           AND pg_has_role(p.proowner, 'USAGE')
           AND p.prosrc !~ $re$\n[ \t]*PERFORM [^;\n]*outbox_notify\(\);$re$
    LOOP
        def := pg_get_functiondef(f);
        IF def IS NOT NULL THEN
            EXECUTE regexp_replace(def, $re$\n([ \t]*)RETURN NULL;$re$,
                E'\n\\1PERFORM ' || replace(quote_ident(s), E'\\', E'\\\\')
                    || E'.outbox_notify();\n\\1RETURN NULL;');
        END IF;
    END LOOP;
END
$do$;
