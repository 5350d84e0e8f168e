-- Trigger-path probe (docs/benchmarks.md, "Where the trigger path's last
-- tenth goes"). Run on a database migrated by `events migrate`, in schema
-- public. Each table is the bench's watched table with one variant of the
-- watch's own trigger function:
--   w_none   no notify check at all (the ceiling)
--   w_ship   as InstallWatch writes it: INSERT, then PERFORM outbox_notify()
--   w_never  the same check, on its own slot with a 1 h interval (reads
--            outbox_settings and a slot per row, never notifies)
--   w_exact  the check made exact: a pg_try_advisory_xact_lock per time slot
--   w_view   the check folded into the INSERT through a view (one statement)

CREATE SEQUENCE probe_slot_never AS bigint MINVALUE 0 START 0;
CREATE FUNCTION probe_notify_never() RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    s    outbox_settings%ROWTYPE;
    now  bigint;
    last bigint;
BEGIN
    SELECT * INTO s FROM outbox_settings;
    IF s.notify_interval < interval '0' THEN
        RETURN;
    END IF;
    now := floor(date_part('epoch', clock_timestamp()) * 1000000);
    SELECT last_value INTO last FROM probe_slot_never;
    IF last <= now AND now < last + 3600000000 THEN
        RETURN;
    END IF;
    PERFORM setval('probe_slot_never', now);
    PERFORM pg_notify(s.channel, '');
END
$$;

CREATE FUNCTION probe_notify_exact() RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    s    outbox_settings%ROWTYPE;
    now  bigint;
    last bigint;
    step bigint;
BEGIN
    SELECT * INTO s FROM outbox_settings;
    IF s.notify_interval < interval '0' THEN
        RETURN;
    END IF;
    IF s.notify_interval > interval '0' THEN
        now := floor(date_part('epoch', clock_timestamp()) * 1000000);
        SELECT last_value INTO last FROM outbox_notify_slot;
        step := floor(date_part('epoch', s.notify_interval) * 1000000);
        IF last <= now AND now < last + step THEN
            RETURN;
        END IF;
        IF NOT pg_try_advisory_xact_lock('outbox_notify_slot'::regclass::oid::int, ((now / step) % 2147483647)::int) THEN
            RETURN;
        END IF;
        PERFORM setval('outbox_notify_slot', now);
    END IF;
    PERFORM pg_notify(s.channel, '');
END
$$;

CREATE VIEW probe_notify_check AS
SELECT pg_notify(s.channel, '')::text AS notified
  FROM outbox_settings s,
       outbox_notify_slot q,
       (SELECT floor(date_part('epoch', clock_timestamp()) * 1000000)::bigint AS now) c
 WHERE s.notify_interval = interval '0'
    OR (s.notify_interval > interval '0'
        AND NOT (q.last_value <= c.now AND c.now < q.last_value + floor(date_part('epoch', s.notify_interval) * 1000000)::bigint)
        AND setval('outbox_notify_slot', c.now) IS NOT NULL);

CREATE TABLE probe_accounts (id int PRIMARY KEY, balance bigint NOT NULL);
INSERT INTO probe_accounts SELECT g, 0 FROM generate_series(1, 1000) g;

DO $do$
DECLARE
    v record;
BEGIN
    FOR v IN SELECT * FROM (VALUES
        ('w_none',  '', ''),
        ('w_ship',  'PERFORM public.outbox_notify();', ''),
        ('w_never', 'PERFORM public.probe_notify_never();', ''),
        ('w_exact', 'PERFORM public.probe_notify_exact();', ''),
        ('w_view',  '', ' FROM (SELECT count(*) FROM public.probe_notify_check) n')) AS t(name, call, src)
    LOOP
        EXECUTE format('CREATE TABLE %I (id int PRIMARY KEY, balance bigint NOT NULL)', v.name);
        EXECUTE format('INSERT INTO %I SELECT g, 0 FROM generate_series(1, 1000) g', v.name);
        EXECUTE format($f$CREATE FUNCTION %I() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, public AS $b$
BEGIN
    INSERT INTO public.outbox_events (id, type, subject, payload, scope)
    SELECT public.outbox_uuidv7(), 'account.changed', 'account:' || coalesce(to_jsonb(NEW.id) #>> '{}', ''), '{}'::jsonb, ''%s;
    %s
    RETURN NULL;
END $b$$f$, 'fn_' || v.name, v.src, v.call);
        EXECUTE format('CREATE TRIGGER t AFTER UPDATE ON %I FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION %I()', v.name, 'fn_' || v.name);
    END LOOP;
END
$do$;
