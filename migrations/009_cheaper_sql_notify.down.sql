-- Back to version 008: the helpers as 003 (outbox_uuidv7) and 004
-- (outbox_notify) wrote them.
CREATE OR REPLACE FUNCTION outbox_uuidv7()
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
