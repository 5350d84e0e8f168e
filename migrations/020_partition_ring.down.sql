-- Back to version 019: one table again. Unlike the up, this copies the
-- ring's rows into the table of slot -1 (recreated if it was dropped), under
-- an exclusive lock for as long as the copy takes.
LOCK TABLE outbox_events IN ACCESS EXCLUSIVE MODE;

DO $$
DECLARE
    last bigint;
    called boolean;
    g record;
BEGIN
    SELECT last_value, is_called INTO last, called FROM outbox_events_seq_seq;
    IF to_regclass('outbox_events_legacy') IS NOT NULL THEN
        ALTER TABLE outbox_events DETACH PARTITION outbox_events_legacy;
    ELSE
        CREATE TABLE outbox_events_legacy (
            seq             bigint      NOT NULL,
            id              uuid        NOT NULL,
            type            text        NOT NULL,
            subject         text        NOT NULL DEFAULT '',
            payload         jsonb       NOT NULL DEFAULT '{}',
            created_at      timestamptz NOT NULL DEFAULT now(),
            fanned_out_at   timestamptz,
            fanout          jsonb,
            attempts        integer     NOT NULL DEFAULT 0,
            last_error      text,
            next_attempt_at timestamptz,
            poisoned_at     timestamptz,
            xact_id         xid8        NOT NULL DEFAULT pg_current_xact_id(),
            catch_up        text[],
            trace_context   jsonb,
            scope           text        NOT NULL DEFAULT '',
            slot            smallint    NOT NULL DEFAULT -1,
            CONSTRAINT outbox_events_pkey PRIMARY KEY (seq),
            CONSTRAINT outbox_events_id_key UNIQUE (id),
            CONSTRAINT outbox_events_type_check CHECK (type <> '' AND length(type) <= 255),
            CONSTRAINT outbox_events_subject_check CHECK (length(subject) <= 255),
            CONSTRAINT outbox_events_scope_check CHECK (length(scope) <= 255),
            CONSTRAINT outbox_events_legacy_slot CHECK (slot = -1)
        ) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000,
                autovacuum_analyze_scale_factor = 0.05, autovacuum_vacuum_cost_limit = 2000);
        CREATE INDEX outbox_events_pending_idx ON outbox_events_legacy (seq)
            WHERE fanned_out_at IS NULL AND poisoned_at IS NULL;
        CREATE INDEX outbox_events_retry_idx ON outbox_events_legacy (next_attempt_at)
            WHERE fanned_out_at IS NULL AND poisoned_at IS NULL AND attempts > 0;
        CREATE INDEX outbox_events_poisoned_idx ON outbox_events_legacy (poisoned_at DESC, seq DESC)
            WHERE poisoned_at IS NOT NULL;
        CREATE INDEX outbox_events_catch_up_idx ON outbox_events_legacy USING gin (catch_up)
            WHERE catch_up IS NOT NULL;
        CREATE INDEX outbox_events_fanned_idx ON outbox_events_legacy (fanned_out_at)
            WHERE fanned_out_at IS NOT NULL AND poisoned_at IS NULL;
        CREATE INDEX outbox_events_claim_floor_idx ON outbox_events_legacy (xact_id, seq)
            WHERE fanned_out_at IS NULL AND poisoned_at IS NULL AND attempts = 0;
    END IF;
    INSERT INTO outbox_events_legacy (seq, id, type, subject, payload, created_at, fanned_out_at, fanout, attempts,
                                      last_error, next_attempt_at, poisoned_at, xact_id, catch_up, trace_context, scope, slot)
    SELECT seq, id, type, subject, payload, created_at, fanned_out_at, fanout, attempts,
           last_error, next_attempt_at, poisoned_at, xact_id, catch_up, trace_context, scope, -1
      FROM outbox_events;
    FOR g IN SELECT a.grantee, a.privilege_type, a.is_grantable
               FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
              WHERE c.oid = 'outbox_events'::regclass AND a.grantee <> c.relowner LOOP
        EXECUTE format('GRANT %s ON outbox_events_legacy TO %s%s', g.privilege_type,
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
    DROP TABLE outbox_events;
    ALTER TABLE outbox_events_legacy RENAME TO outbox_events;
    EXECUTE format('ALTER TABLE outbox_events ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (START WITH %s)',
                   CASE WHEN called THEN last + 1 ELSE last END);
END
$$;

CREATE TRIGGER outbox_recorded AFTER INSERT ON outbox_events
    FOR EACH ROW WHEN (current_setting('transaction_isolation') = 'serializable')
    EXECUTE FUNCTION outbox_note_recorded();

DROP FUNCTION IF EXISTS outbox_claim_rows(xid8, bigint, xid8[], integer);
DROP FUNCTION IF EXISTS outbox_truncate_expired(regclass, bigint);
DROP FUNCTION IF EXISTS outbox_expired_partitions(bigint);
DROP FUNCTION IF EXISTS outbox_partition_expired(regclass, bigint);
DROP FUNCTION IF EXISTS outbox_set_partition_period(interval);
DROP FUNCTION IF EXISTS outbox_slot_of(timestamptz);
DROP FUNCTION IF EXISTS outbox_partition_period();

-- 014's outbox_recorded_in_tx.
CREATE OR REPLACE FUNCTION outbox_recorded_in_tx()
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
