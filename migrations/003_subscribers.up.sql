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
    PERFORM pg_notify('standmeet_events', '');
    RETURN new_id;
END
$$;
