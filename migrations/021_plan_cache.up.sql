-- The functions that the relay calls every round (claims, the idle poll's
-- checks, the looks below the claim floor, the ordered append's blockers)
-- and Stats, as PL/pgSQL with generic plans. As SQL functions that cannot
-- be inlined (their SET clauses keep them from it), each call planned its
-- queries anew; on one table that cost about 0.1 ms, but outbox_events is
-- partitioned since 020, and planning a query over its ten partitions (and
-- their indexes) costs about 0.5 ms: a claim cost 1.3-3 ms instead of
-- 0.35, and commit-to-fanned latency doubled. PL/pgSQL keeps each query's
-- plan for the session. An SQL function plans with its arguments as
-- parameters (a generic plan), and plan_cache_mode = force_generic_plan
-- keeps those same plans: a custom plan, planned for the arguments' values,
-- would cost the planning again at every call (the claims read every
-- partition, so a custom plan prunes nothing). The queries are those of
-- the versions they replace (004, 011, 016, 018, 020), unchanged.
-- The stamp of a pending-lane round becomes such a function too,
-- outbox_stamp: as a prepared statement it was planned anew (a custom
-- plan, 0.6 ms over the ten partitions) at half the rounds or more, and a
-- function's SET clause scopes the generic plan to the stamp alone, in a
-- round of the relay's own and inside a host's transaction (FanoutTx)
-- alike. Relays of the release before keep their own statement.
-- Returned columns named like the table's (seq, subject, ...) would be
-- ambiguous in PL/pgSQL; #variable_conflict use_column reads the table's,
-- as the SQL functions did.

CREATE OR REPLACE FUNCTION outbox_claim_rows(p_floor xid8, p_seq bigint, p_running xid8[], p_limit integer)
RETURNS TABLE (seq bigint, id uuid, type text, subject text, scope text, payload jsonb,
               created_at timestamptz, attempts integer, trace_context jsonb, xact_id xid8, slot smallint)
LANGUAGE plpgsql VOLATILE
ROWS 10
SET enable_sort = off
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
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
     LIMIT p_limit;
END
$$;

CREATE OR REPLACE FUNCTION outbox_pending_from(p_floor xid8, p_seq bigint, p_running xid8[])
RETURNS boolean
LANGUAGE plpgsql STABLE
SET enable_sort = off
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN (
    SELECT (SELECT e.xact_id FROM outbox_events e
             WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.attempts = 0
               AND e.xact_id = ANY(p_running)
             ORDER BY e.xact_id LIMIT 1) IS NOT NULL
        OR (SELECT e.xact_id FROM outbox_events e
             WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.attempts = 0
               AND (e.xact_id, e.seq) > (p_floor, p_seq)
             ORDER BY e.xact_id, e.seq LIMIT 1) IS NOT NULL);
END
$$;

CREATE OR REPLACE FUNCTION outbox_pending_below(p_from xid8, p_below xid8, p_seq bigint, p_dropped xid8[], p_skip xid8[])
RETURNS xid8
LANGUAGE plpgsql VOLATILE
SET enable_sort = off
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN (
    SELECT least(
        (SELECT e.xact_id FROM outbox_events e
          WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.attempts = 0
            AND e.xact_id >= p_from AND (e.xact_id, e.seq) <= (p_below, p_seq)
            AND e.xact_id <> ALL(coalesce(p_skip, '{}'))
          ORDER BY e.xact_id LIMIT 1
            FOR UPDATE SKIP LOCKED),
        (SELECT e.xact_id FROM outbox_events e
          WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.attempts = 0
            AND e.xact_id = ANY(p_dropped)
          ORDER BY e.xact_id LIMIT 1
            FOR UPDATE SKIP LOCKED)));
END
$$;

CREATE OR REPLACE FUNCTION outbox_retry_next()
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET enable_sort = off
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN (
    SELECT e.next_attempt_at FROM outbox_events e
     WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.attempts > 0
     ORDER BY e.next_attempt_at LIMIT 1);
END
$$;

CREATE OR REPLACE FUNCTION outbox_claim_due(p_limit integer)
RETURNS TABLE (seq bigint)
LANGUAGE plpgsql VOLATILE
ROWS 10
SET enable_sort = off
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT e.seq FROM outbox_events e
     WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.attempts > 0 AND e.next_attempt_at <= now()
     ORDER BY e.next_attempt_at LIMIT p_limit
       FOR UPDATE SKIP LOCKED;
END
$$;

CREATE OR REPLACE FUNCTION outbox_chain_blockers(subs text[], subjects text[], max_seqs bigint[], res text[], blocks boolean[],
    claimed bigint[], pair_seqs bigint[], pair_subs text[])
RETURNS TABLE (subscriber text, subject text, blocker_seq bigint, blocker_due timestamptz)
LANGUAGE plpgsql
STABLE
SET search_path FROM CURRENT
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
WITH ch AS MATERIALIZED (
    SELECT * FROM unnest(subs, subjects, max_seqs, res, blocks) AS c(sub, subj, max_seq, re, block)),
ev AS MATERIALIZED (
    SELECT e.seq, e.subject, e.type, CASE WHEN e.attempts > 0 THEN e.next_attempt_at END AS due FROM outbox_events e
     WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL
       AND e.seq < (SELECT max(max_seq) FROM ch) AND e.subject = ANY(subjects)
       AND e.seq <> ALL(coalesce(claimed, '{}'))),
rp AS MATERIALIZED (
    SELECT * FROM unnest(pair_seqs, pair_subs) AS p(seq, sub))
SELECT ch.sub, ch.subj, b.seq, b.due
  FROM ch LEFT JOIN LATERAL (
    SELECT x.seq, x.due FROM (
        SELECT ev.seq, ev.due FROM ev WHERE ev.subject = ch.subj AND ev.seq < ch.max_seq AND ('.' || ev.type) ~ ch.re
        UNION ALL
        (SELECT d.event_seq, CASE WHEN d.poisoned_at IS NULL THEN d.next_attempt_at END
           FROM outbox_deliveries d
          WHERE d.subscriber = ch.sub AND d.subject = ch.subj AND d.event_seq < ch.max_seq
            AND (ch.block OR d.poisoned_at IS NULL)
            AND NOT EXISTS (SELECT 1 FROM rp WHERE rp.seq = d.event_seq AND rp.sub = d.subscriber)
          ORDER BY d.event_seq LIMIT 1)) x
     ORDER BY x.seq LIMIT 1) b ON true;
END
$$;

CREATE OR REPLACE FUNCTION outbox_stats(
    OUT pending bigint, OUT retrying bigint, OUT poisoned bigint, OUT catching_up bigint,
    OUT fanned_last_minute bigint, OUT lag_seconds double precision)
LANGUAGE plpgsql
STABLE
SET search_path FROM CURRENT
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
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
  INTO pending, retrying, poisoned, catching_up, fanned_last_minute, lag_seconds;
END
$$;

-- A pending-lane round's stamp: p_seqs fanned out now, with their fanout
-- documents p_fanout, in their partitions p_slots (joined on with seq, each
-- row's probe goes to its partition alone: the nested loop prunes per row,
-- in a generic plan too); every other active registered subscriber (not in
-- p_served) whose types match an event, or whose types are unknown
-- (registered by an older release), is owed it, as a pair. The registry
-- rows read are locked FOR KEY SHARE, so a RetireSubscriber (which locks
-- its row FOR UPDATE) waits for this stamp, and a stamp after it sees the
-- subscriber retired: a retired name is never written back. When the relay
-- knows every registered subscriber, which is the common path, no row is
-- locked and no pair written.
--
-- Its plan is kept, so it must not depend on a partition's size when it
-- was planned: a partition analyzed while empty would be read whole per row
-- once the ring has moved into it, until an analyze of it replans (771 ms
-- for 100 rows, in a review). Sequential scans are priced out, so each row
-- probes its partition's primary key; JIT is off, which that pricing would
-- otherwise set off at every call.
CREATE FUNCTION outbox_stamp(p_seqs bigint[], p_fanout text[], p_served text[], p_slots smallint[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    WITH lacking AS (
        SELECT s.name, s.types_regexp FROM outbox_subscribers s
         WHERE s.retired_at IS NULL AND s.name <> ALL(p_served)
           FOR KEY SHARE),
    stamped AS (
        UPDATE outbox_events AS e
           SET fanned_out_at = now(), fanout = u.fanout::jsonb, next_attempt_at = NULL
          FROM unnest(p_seqs, p_fanout, p_slots) AS u(seq, fanout, slot)
         WHERE e.seq = u.seq AND e.slot = u.slot
        RETURNING e.seq, e.type)
    INSERT INTO outbox_deliveries (event_seq, subscriber)
    SELECT st.seq, l.name
      FROM stamped st JOIN lacking l ON l.types_regexp IS NULL OR ('.' || st.type) ~ l.types_regexp
    ON CONFLICT DO NOTHING;
END
$$;
