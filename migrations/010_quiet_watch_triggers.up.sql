-- Version 0.2.0, step 7: watch triggers send no notification.
--
-- Every row a watch trigger recorded called outbox_notify(), whose throttle
-- check (a nested PL/pgSQL call reading outbox_settings and a sequence) ran
-- once per written row inside the host's transaction. Under 32 concurrent
-- writers on a durable server it cost about a tenth of a watched table's
-- write throughput however it was written (docs/benchmarks.md, "Fourth
-- session"; docs/probes/trigger-notify). The relays find these rows by
-- polling instead: after activity they look again within milliseconds, with
-- growing gaps, then every poll interval (README, "How relays wake up").
-- outbox_record() still notifies, throttled, and a SQL writer that wants the
-- relays at once may call outbox_notify() itself.
--
-- Online: CREATE OR REPLACE FUNCTION rewrites no table and takes no lock on
-- one; a trigger firing meanwhile runs the old body or the new, which make
-- the same rows. The previous release's relays poll too, every poll
-- interval; its binaries call nothing that changes.

-- The trigger function behind events.InstallWatch, as in 007 without the
-- notification.
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
    RETURN NULL;
END
$$;

-- Each watch's own trigger function (watchfn.go), the same way. A function
-- this role may not replace (another role's) keeps notifying: it records the
-- same rows. (The regular expressions are dollar-quoted: they read the same
-- whatever standard_conforming_strings says. A function dropped meanwhile
-- has no definition left, and is skipped.)
DO $do$
DECLARE
    f   oid;
    def text;
BEGIN
    FOR f IN
        SELECT p.oid FROM pg_proc p
         WHERE p.proname ~ '^outbox_watch_[0-9a-f]{16}$'
           AND p.pronamespace = (SELECT pronamespace FROM pg_proc WHERE oid = 'outbox_watch()'::regprocedure)
           AND pg_has_role(p.proowner, 'USAGE')
           AND strpos(p.prosrc, 'outbox_notify()') > 0
    LOOP
        def := pg_get_functiondef(f);
        IF def IS NOT NULL THEN
            EXECUTE regexp_replace(def, $re$\n[ \t]*PERFORM [^;\n]*outbox_notify\(\);$re$, '');
        END IF;
    END LOOP;
END
$do$;
