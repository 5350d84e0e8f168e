-- Retention by whole partitions (issue 31), step 2 of 2. outbox_events
-- becomes a table partitioned by LIST (slot): a ring of ten partitions,
-- slots 0 to 9, each written for one period (a day, see
-- outbox_partition_period) and emptied with TRUNCATE by retention once
-- every row in it is fanned out, older than the retention and owes
-- nothing (outbox_truncate_expired). A TRUNCATE costs the same for ten
-- rows as for ten million, leaves no dead rows for VACUUM and no dead index
-- entries for the claims to step over, whatever snapshot is held.
--
-- Online: the table as it was becomes the partition of slot -1
-- (outbox_events_legacy), not copied. 019 added the slot column (-1 on
-- every row) and a NOT VALID check; validating it scans the table under a
-- SHARE UPDATE EXCLUSIVE lock, which writers do not wait for; with it, the
-- ATTACH does not scan. The swap that follows takes an exclusive lock on
-- the table for an instant (catalog changes only), bounded by Migrate's
-- lock_timeout, which retries after a pause. An empty table (a new
-- install) is dropped rather than attached.
--
-- What stays the same for the statements of this release and the one
-- before: the table's name, columns, defaults, checks and the trigger.
-- What changes: seq comes from a sequence of its own (outbox_events_seq_seq,
-- the identity's name, carrying on from its value; a partitioned table
-- cannot have an identity in PostgreSQL 15), and seq and id are unique per
-- partition (a partitioned table's unique keys must hold the partition key;
-- seq is unique as it comes from one sequence, id as it is a UUIDv7 the
-- library or the caller makes).
ALTER TABLE outbox_events VALIDATE CONSTRAINT outbox_events_legacy_slot;

LOCK TABLE outbox_events IN ACCESS EXCLUSIVE MODE;

DO $$
DECLARE
    last bigint;
    called boolean;
BEGIN
    SELECT last_value, is_called INTO last, called FROM outbox_events_seq_seq;
    ALTER TABLE outbox_events ALTER COLUMN seq DROP IDENTITY;
    CREATE SEQUENCE outbox_events_seq_seq;
    PERFORM setval('outbox_events_seq_seq', last, called);
END
$$;

ALTER TABLE outbox_events RENAME TO outbox_events_legacy;
DROP TRIGGER outbox_recorded ON outbox_events_legacy;

-- The length of a slot's period; outbox_set_partition_period changes it.
CREATE FUNCTION outbox_partition_period()
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT interval '1 day' $$;

-- The slot a row recorded at p_at goes to: the period's number modulo 10.
-- An SQL function the planner inlines into the INSERT (so it has no SET
-- clause, and names no other function: it must not depend on the host's
-- search_path); outbox_set_partition_period writes it again.
CREATE FUNCTION outbox_slot_of(p_at timestamptz)
RETURNS smallint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT (floor(extract(epoch FROM p_at) / 86400)::bigint % 10)::smallint $$;

CREATE TABLE outbox_events (
    seq             bigint      NOT NULL DEFAULT nextval('outbox_events_seq_seq'),
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
    slot            smallint    NOT NULL DEFAULT outbox_slot_of(now()),
    CONSTRAINT outbox_events_type_check CHECK (type <> '' AND length(type) <= 255),
    CONSTRAINT outbox_events_subject_check CHECK (length(subject) <= 255),
    CONSTRAINT outbox_events_scope_check CHECK (length(scope) <= 255)
) PARTITION BY LIST (slot);
ALTER SEQUENCE outbox_events_seq_seq OWNED BY outbox_events.seq;
-- An identity needs no privilege on its sequence; a default's nextval
-- does: every role that may insert into outbox_events may take a seq (as
-- 004 does for outbox_notify_slot). Seqs order rows, they grant nothing.
GRANT USAGE ON SEQUENCE outbox_events_seq_seq TO PUBLIC;

-- The roles the table was granted to (a host role that records, say) keep
-- what they had, on the table they now name.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT a.grantee, a.privilege_type, a.is_grantable
               FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
              WHERE c.oid = 'outbox_events_legacy'::regclass AND a.grantee <> c.relowner LOOP
        EXECUTE format('GRANT %s ON outbox_events TO %s%s', g.privilege_type,
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;

CREATE TRIGGER outbox_recorded AFTER INSERT ON outbox_events
    FOR EACH ROW WHEN (current_setting('transaction_isolation') = 'serializable')
    EXECUTE FUNCTION outbox_note_recorded();

-- The ring: each partition with the indexes the table had (catch_up's
-- as a btree: 0.1.0's lists are only ever looked for, never searched).
DO $$
BEGIN
    FOR s IN 0..9 LOOP
        EXECUTE format($f$
            CREATE TABLE outbox_events_%1$s PARTITION OF outbox_events
                (PRIMARY KEY (seq), UNIQUE (id)) FOR VALUES IN (%1$s)
                WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000,
                      autovacuum_analyze_scale_factor = 0.05, autovacuum_vacuum_cost_limit = 2000);
            CREATE INDEX outbox_events_%1$s_pending_idx ON outbox_events_%1$s (seq)
                WHERE fanned_out_at IS NULL AND poisoned_at IS NULL;
            CREATE INDEX outbox_events_%1$s_retry_idx ON outbox_events_%1$s (next_attempt_at)
                WHERE fanned_out_at IS NULL AND poisoned_at IS NULL AND attempts > 0;
            CREATE INDEX outbox_events_%1$s_poisoned_idx ON outbox_events_%1$s (poisoned_at DESC, seq DESC)
                WHERE poisoned_at IS NOT NULL;
            CREATE INDEX outbox_events_%1$s_fanned_idx ON outbox_events_%1$s (fanned_out_at)
                WHERE fanned_out_at IS NOT NULL AND poisoned_at IS NULL;
            CREATE INDEX outbox_events_%1$s_claim_floor_idx ON outbox_events_%1$s (xact_id, seq)
                WHERE fanned_out_at IS NULL AND poisoned_at IS NULL AND attempts = 0;
            CREATE INDEX outbox_events_%1$s_catch_up_idx ON outbox_events_%1$s (seq)
                WHERE catch_up IS NOT NULL;
        $f$, s);
    END LOOP;
END
$$;

-- The new table, its sequence and partitions belong to the old table's
-- owner (the migration may run as another role: a superuser, a member of
-- the owner's role), and each partition carries the old table's grants, a
-- role that may DELETE its rows also TRUNCATE: retention reads, locks and
-- empties the partitions themselves, as whichever role the relay runs as.
-- (Column-level grants are not carried over.)
DO $$
DECLARE
    owner regrole;
    g record;
BEGIN
    SELECT relowner::regrole INTO owner FROM pg_class WHERE oid = 'outbox_events_legacy'::regclass;
    EXECUTE format('ALTER TABLE outbox_events OWNER TO %s', owner);
    FOR s IN 0..9 LOOP
        EXECUTE format('ALTER TABLE outbox_events_%s OWNER TO %s', s, owner);
        FOR g IN SELECT a.grantee, a.privilege_type, a.is_grantable
                   FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
                  WHERE c.oid = 'outbox_events_legacy'::regclass AND a.grantee <> c.relowner LOOP
            EXECUTE format('GRANT %s ON outbox_events_%s TO %s%s',
                           CASE WHEN g.privilege_type = 'DELETE' THEN 'DELETE, TRUNCATE' ELSE g.privilege_type END, s,
                           CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
                           CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
    END LOOP;
END
$$;

-- The table as it was: attached if it holds rows (retention empties it
-- like the others), dropped if it is empty.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM outbox_events_legacy) THEN
        ALTER TABLE outbox_events ATTACH PARTITION outbox_events_legacy FOR VALUES IN (-1);
    ELSE
        DROP TABLE outbox_events_legacy;
    END IF;
END
$$;

-- outbox_set_partition_period sets the length of a slot's period: rows
-- recorded from then on go to the slot of their period. A partition is
-- emptied only once all of its rows have expired, and the ring comes back
-- to a slot after ten periods: with a period of a day, a retention of up to
-- eight days empties whole partitions; a longer one needs a longer period
-- (a shorter one, a shorter period, for smaller partitions).
CREATE FUNCTION outbox_set_partition_period(p_period interval)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_period IS NULL OR p_period < interval '1 second' THEN
        RAISE EXCEPTION 'outbox_set_partition_period: the period must be at least a second, not %', p_period
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    EXECUTE format('CREATE OR REPLACE FUNCTION outbox_partition_period() RETURNS interval '
                   'LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $f$ SELECT %L::interval $f$', p_period);
    EXECUTE format('CREATE OR REPLACE FUNCTION outbox_slot_of(p_at timestamptz) RETURNS smallint '
                   'LANGUAGE sql STABLE PARALLEL SAFE AS $f$ SELECT (floor(extract(epoch FROM p_at) / %s)::bigint %% 10)::smallint $f$',
                   extract(epoch FROM p_period));
END
$$;

-- Whether every row of the partition p_part is fanned out more than
-- p_retention_us µs ago and owes nothing (what Prune deletes one by one):
-- not pending, not poisoned, no 0.1.0 catch_up list, no owed or poisoned
-- pair, and the partition not empty. Each test is one probe of a partial
-- index of the partition's (the pairs: the range of seqs the partition
-- holds, in outbox_deliveries' primary key).
CREATE FUNCTION outbox_partition_expired(p_part regclass, p_retention_us bigint)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    expired boolean;
BEGIN
    EXECUTE format($q$
        SELECT (SELECT min(seq) FROM %1$s) IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM %1$s WHERE fanned_out_at IS NULL AND poisoned_at IS NULL)
           AND NOT EXISTS (SELECT 1 FROM %1$s WHERE poisoned_at IS NOT NULL)
           AND NOT EXISTS (SELECT 1 FROM %1$s WHERE catch_up IS NOT NULL)
           AND NOT EXISTS (SELECT 1 FROM %1$s WHERE fanned_out_at >= now() - $1 * interval '1 microsecond'
                                                AND fanned_out_at IS NOT NULL AND poisoned_at IS NULL)
           AND NOT EXISTS (SELECT 1 FROM outbox_deliveries d
                            WHERE d.event_seq BETWEEN (SELECT min(seq) FROM %1$s) AND (SELECT max(seq) FROM %1$s)
                              AND EXISTS (SELECT 1 FROM %1$s e WHERE e.seq = d.event_seq))
        $q$, p_part) INTO expired USING p_retention_us;
    RETURN expired;
END
$$;

-- The partitions retention may try to empty: every one whose rows have all
-- expired (looked at without a lock), but the slots of this period and the
-- one before, which host transactions write to.
CREATE FUNCTION outbox_expired_partitions(p_retention_us bigint)
RETURNS SETOF regclass
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT c.oid::regclass
      FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
     WHERE i.inhparent = 'outbox_events'::regclass
       AND (regexp_match(pg_get_expr(c.relpartbound, c.oid), '-?\d+'))[1]::smallint
           NOT IN (outbox_slot_of(now()), outbox_slot_of(now() - outbox_partition_period()))
       AND outbox_partition_expired(c.oid::regclass, p_retention_us)
     ORDER BY c.relname
$$;

-- Empties the partition p_part if all of its rows have expired, looking
-- again under an exclusive lock on it, taken NOWAIT: it never waits in the
-- lock queue, where it would hold back whoever comes after it (a claim, a
-- host transaction's read), and fails at once (lock_not_available) while
-- anyone writes to the partition or reads the table; the caller tries
-- again a moment later. Under the lock nobody else can write to the partition and
-- every committed row is seen, so nothing that is not expired is lost, in
-- whichever slot it was recorded. Returns whether it emptied it.
CREATE FUNCTION outbox_truncate_expired(p_part regclass, p_retention_us bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE NOWAIT', p_part);
    IF NOT outbox_partition_expired(p_part, p_retention_us) THEN
        RETURN false;
    END IF;
    EXECUTE format('TRUNCATE %s', p_part);
    RETURN true;
END
$$;

-- 018's outbox_claim_from, returning each row's slot too: the stamp names
-- the partitions it updates, so that the others are pruned rather than
-- probed for every seq of the batch. 018's stays for relays of the release
-- before during a deploy.
CREATE FUNCTION outbox_claim_rows(p_floor xid8, p_seq bigint, p_running xid8[], p_limit integer)
RETURNS TABLE (seq bigint, id uuid, type text, subject text, scope text, payload jsonb,
               created_at timestamptz, attempts integer, trace_context jsonb, xact_id xid8, slot smallint)
LANGUAGE sql VOLATILE
ROWS 10
SET enable_sort = off
SET search_path FROM CURRENT
AS $$
    WITH running AS (
        SELECT e.seq, e.id, e.type, e.subject, e.scope, e.payload, e.created_at, e.attempts, e.trace_context, e.xact_id, e.slot
          FROM outbox_events e
         WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.attempts = 0
           AND e.xact_id = ANY(p_running)
         ORDER BY e.xact_id, e.seq LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    ), from_floor AS (
        SELECT e.seq, e.id, e.type, e.subject, e.scope, e.payload, e.created_at, e.attempts, e.trace_context, e.xact_id, e.slot
          FROM outbox_events e
         WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.attempts = 0
           AND (e.xact_id, e.seq) > (p_floor, p_seq)
         ORDER BY e.xact_id, e.seq LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    )
    SELECT * FROM running
    UNION ALL
    SELECT * FROM from_floor
     LIMIT p_limit
$$;

-- RecordedInTx under SERIALIZABLE reads the session's notes, which the
-- trigger writes with TG_RELID: on a partitioned table, the partition the
-- row went to. The notes of this schema's outbox are those of its
-- partitions (or of the table itself: notes written before the swap).
-- At other levels it reads the rows its transaction wrote from the
-- partition they went to, the slot of the transaction's start (now()),
-- not through the table: a read of the table locks every partition, and
-- would wait behind retention emptying an old one. (Rows given a slot by
-- hand, or recorded before outbox_set_partition_period changed the period
-- in the same transaction, are not found.)
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
                OR r.outbox_table IN (SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = 'outbox_events'::regclass)
             ORDER BY r.seq;
        END IF;
        RETURN;
    END IF;
    RETURN QUERY EXECUTE format(
        'SELECT e.seq, e.id, e.type, e.subject, e.scope, e.payload, e.created_at
           FROM %I e
          WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.xact_id = pg_current_xact_id_if_assigned()
          ORDER BY e.seq', 'outbox_events_' || outbox_slot_of(now()));
END
$$;
