-- RecordedInTx raises no serialization failure of its own (issue 30).
-- Under SERIALIZABLE, reading the transaction's own pending rows from
-- outbox_events took predicate locks on the pending index, which every
-- other writer inserts into: two SERIALIZABLE transactions that both called
-- RecordedInTx failed with 40001 (115 of 200 in a probe).
--
-- Temporary tables take no predicate locks. In a SERIALIZABLE transaction
-- only, each event recorded (by Record, RecordMany, outbox_record or a watch
-- trigger: all insert into outbox_events) is also noted in the session's
-- temporary table outbox_recorded, created on first use and emptied at every
-- commit, and RecordedInTx (outbox_recorded_in_tx) reads it there. At other levels nothing is noted
-- (the trigger's WHEN is false, and the event is not queued) and RecordedInTx
-- reads outbox_events as before. A transaction that noted an event cannot be
-- prepared (PREPARE TRANSACTION refuses temporary objects). A role without
-- the TEMPORARY privilege on the database notes nothing, and RecordedInTx
-- reads outbox_events as before.
--
-- Online: a function and a trigger. CREATE TRIGGER waits for the inserts in
-- flight on outbox_events and holds its lock for an instant.
CREATE FUNCTION outbox_note_recorded()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF to_regclass('pg_temp.outbox_recorded') IS NULL THEN
        IF NOT has_database_privilege(current_database(), 'TEMPORARY') THEN
            RETURN NULL; -- a role that may not: RecordedInTx reads outbox_events
        END IF;
        CREATE TEMPORARY TABLE outbox_recorded (
            outbox_table oid NOT NULL,
            seq bigint NOT NULL,
            id uuid NOT NULL,
            type text NOT NULL,
            subject text NOT NULL,
            scope text NOT NULL,
            payload jsonb NOT NULL,
            created_at timestamptz NOT NULL
        ) ON COMMIT DELETE ROWS;
    END IF;
    INSERT INTO pg_temp.outbox_recorded
    VALUES (TG_RELID, NEW.seq, NEW.id, NEW.type, NEW.subject, NEW.scope, NEW.payload, NEW.created_at);
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_recorded AFTER INSERT ON outbox_events
    FOR EACH ROW WHEN (current_setting('transaction_isolation') = 'serializable')
    EXECUTE FUNCTION outbox_note_recorded();

-- The events the transaction has recorded so far, oldest first: from the
-- session's notes under SERIALIZABLE (if the role may make them), else its
-- own pending rows from outbox_events, through the relay's index.
CREATE FUNCTION outbox_recorded_in_tx()
RETURNS TABLE (seq bigint, id uuid, type text, subject text, scope text, payload jsonb, created_at timestamptz)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'serializable' AND has_database_privilege(current_database(), 'TEMPORARY') THEN
        IF to_regclass('pg_temp.outbox_recorded') IS NOT NULL THEN
            RETURN QUERY
            SELECT r.seq, r.id, r.type, r.subject, r.scope, r.payload, r.created_at
              FROM pg_temp.outbox_recorded r
             WHERE r.outbox_table = 'outbox_events'::regclass
             ORDER BY r.seq;
        END IF;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT e.seq, e.id, e.type, e.subject, e.scope, e.payload, e.created_at
      FROM outbox_events e
     WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.xact_id = pg_current_xact_id_if_assigned()
     ORDER BY e.seq;
END
$$;
