-- Back to version 003: outbox_notify claims the settings row again (the
-- watch trigger keeps calling it, which works with either).
DROP FUNCTION IF EXISTS outbox_stats();
CREATE OR REPLACE FUNCTION outbox_notify()
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
DROP SEQUENCE IF EXISTS outbox_notify_slot;
ALTER TABLE outbox_settings ALTER COLUMN notify_interval SET DEFAULT '10 milliseconds';
UPDATE outbox_settings SET notify_interval = '10 milliseconds' WHERE notify_interval = '2 milliseconds';
