-- Version 0.2.0, step 6: the SQL write path's per-row helpers, cheaper.
--
-- Every row a watch trigger (or outbox_record) records calls
-- outbox_uuidv7() and outbox_notify(). Under 32 concurrent writers on a
-- durable server (go run ./cmd/eventsbench -only writepath), the trigger
-- path ran at 0.71-0.72x a plain INSERT; the same trigger without the
-- notify check ran at 1.01-1.06x. Two costs go here:
--
--  - outbox_notify read the throttle's slot with pg_sequence_last_value(),
--    which takes the sequence's buffer in exclusive mode: every writer of
--    the cluster queued on one buffer lock, once per row. It now reads the
--    sequence as a relation (SELECT last_value), under a shared lock; setval
--    still moves it (non-transactional, never waits on a transaction, never
--    raises a serialization failure).
--  - both did their clock arithmetic in numeric; it is bigint now.
--
-- Online: CREATE OR REPLACE FUNCTION rewrites no table and takes no lock on
-- one. A transaction running the old bodies meanwhile makes the same rows and
-- the same notifications. The previous release's binaries call nothing that
-- changes.

-- As in 003, with the clock read once, as whole microseconds.
CREATE OR REPLACE FUNCTION outbox_uuidv7()
RETURNS uuid
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    us   bigint  := floor(date_part('epoch', clock_timestamp()) * 1000000);
    frac integer := (us % 1000) * 4096 / 1000;
    b    bytea   := uuid_send(gen_random_uuid());
BEGIN
    b := overlay(b PLACING substring(int8send(us / 1000) FROM 3) FROM 1 FOR 6);
    b := set_byte(b, 6, 112 | (frac >> 8)); -- version 7 in the high nibble
    b := set_byte(b, 7, frac & 255);
    RETURN encode(b, 'hex')::uuid;          -- variant bits come from v4
END
$$;

-- As in 004: at most about one notifying transaction per notify_interval,
-- cluster-wide (0: every transaction; negative: never).
CREATE OR REPLACE FUNCTION outbox_notify()
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    s    outbox_settings%ROWTYPE;
    now  bigint;
    last bigint;
BEGIN
    SELECT * INTO s FROM outbox_settings;
    IF s.notify_interval < interval '0' THEN
        RETURN;
    END IF;
    IF s.notify_interval > interval '0' THEN
        now := floor(date_part('epoch', clock_timestamp()) * 1000000);
        SELECT last_value INTO last FROM outbox_notify_slot;
        IF last <= now AND now < last + floor(date_part('epoch', s.notify_interval) * 1000000) THEN
            RETURN;
        END IF;
        PERFORM setval('outbox_notify_slot', now);
    END IF;
    PERFORM pg_notify(s.channel, '');
END
$$;
