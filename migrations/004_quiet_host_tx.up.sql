-- Version 0.2.0, step 1: nothing the library runs inside a host's
-- transaction locks a shared row or can raise a serialization failure.
--
-- Until now the SQL paths (outbox_record, and so every watch trigger)
-- throttled their notification by claiming the one outbox_settings row
-- FOR UPDATE SKIP LOCKED and updating notified_at. SKIP LOCKED skips rows
-- locked by open transactions, not rows updated by transactions that
-- committed after the caller's snapshot: under REPEATABLE READ and
-- SERIALIZABLE most concurrent writers failed with 40001. The throttle now
-- lives in a sequence: sequences are non-transactional (nextval and setval
-- are never rolled back, never wait for another transaction and never raise
-- a serialization failure; the identity column of outbox_events draws from
-- one in every insert already). outbox_settings is only read.
--
-- Every statement here takes its locks for an instant: no table is
-- rewritten or scanned, so writers do not stall while it runs. The previous
-- release's binaries keep working on the result (their statements name
-- nothing this removes).

-- When outbox_notify last let a transaction notify, in microseconds since
-- the epoch. The transaction that moves it forward notifies; the others of
-- the same interval do not. A time, not a slot number (time / interval), so
-- that changing notify_interval never leaves the last value ahead of every
-- future one.
CREATE SEQUENCE IF NOT EXISTS outbox_notify_slot AS bigint MINVALUE 0 START 0;
-- outbox_notify runs as the host's role, inside the host's transaction:
-- every role that may record reads and moves the sequence (0.1.0 needed
-- UPDATE on outbox_settings for the same). Anyone may notify the channel
-- anyway; a value set in the future is ignored below.
GRANT SELECT, UPDATE ON SEQUENCE outbox_notify_slot TO PUBLIC;

-- One notifying transaction per 2 ms at most (was 10 ms), as Record's
-- default: at 200 events/s most transactions then wake the relays at once
-- (commit to fanned out 1.3 ms, not 2.4), while at thousands of commits per
-- second nine in ten still skip the cluster-wide notify lock. A value set by
-- hand is left alone.
ALTER TABLE outbox_settings ALTER COLUMN notify_interval SET DEFAULT '2 milliseconds';
UPDATE outbox_settings SET notify_interval = '2 milliseconds' WHERE notify_interval = '10 milliseconds';

-- Notifies the relays, at most about once per notify_interval cluster-wide
-- (0: in every transaction; negative: never). Two transactions may both win
-- one interval when they race: a spare notification, never a missing one beyond
-- what the throttle drops on purpose. Since the throttle goes by time, not
-- by commits, a long transaction that notified keeps nobody quiet for
-- longer than one interval. A last value in the future (the clock stepped
-- back) does not hold notifications back.
CREATE OR REPLACE FUNCTION outbox_notify()
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    s    outbox_settings%ROWTYPE;
    now  numeric;
    last numeric;
BEGIN
    SELECT * INTO s FROM outbox_settings;
    IF s.notify_interval < interval '0' THEN
        RETURN;
    END IF;
    IF s.notify_interval > interval '0' THEN
        now  := floor(extract(epoch FROM clock_timestamp()) * 1000000);
        last := pg_sequence_last_value('outbox_notify_slot');
        IF last <= now AND now < last + extract(epoch FROM s.notify_interval) * 1000000 THEN
            RETURN;
        END IF;
        PERFORM setval('outbox_notify_slot', now::bigint);
    END IF;
    PERFORM pg_notify(s.channel, '');
END
$$;

-- The trigger function behind events.InstallWatch, as in 003 but for its
-- notification, which is outbox_notify's.
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

-- How the outbox stands, for events.Stats: every figure from a small partial
-- index. The planner is told not to scan the table: right after a bulk load
-- or a restore, before ANALYZE, it misjudges these partial indexes and would
-- read a million rows to count a handful.
CREATE OR REPLACE FUNCTION outbox_stats(
    OUT pending bigint, OUT retrying bigint, OUT poisoned bigint, OUT catching_up bigint,
    OUT fanned_last_minute bigint, OUT lag_seconds double precision)
LANGUAGE sql
STABLE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
SELECT
    (SELECT count(*) FROM outbox_events WHERE fanned_out_at IS NULL AND poisoned_at IS NULL),
    (SELECT count(*) FROM outbox_events WHERE fanned_out_at IS NULL AND poisoned_at IS NULL AND attempts > 0),
    (SELECT count(*) FROM outbox_events WHERE poisoned_at IS NOT NULL),
    (SELECT count(*) FROM outbox_events
      WHERE catch_up && (SELECT coalesce(array_agg(name), '{}') FROM outbox_subscribers)),
    (SELECT count(*) FROM outbox_events
      WHERE fanned_out_at > now() - interval '1 minute' AND fanned_out_at IS NOT NULL AND poisoned_at IS NULL),
    (SELECT extract(epoch FROM now() - created_at)::double precision FROM outbox_events
      WHERE fanned_out_at IS NULL AND poisoned_at IS NULL ORDER BY seq LIMIT 1)
$$;
