-- Claims from a floor that keeps the transactions still running below it
-- (issue 31): a transaction left open after a write — a console's BEGIN, a
-- long batch job, in any database of the server — is the oldest running
-- one, and a floor at the oldest running transaction stayed there as long
-- as it ran, so the claims walked the dead entries of every event fanned
-- out since (which the open transaction keeps VACUUM from removing). The
-- floor is now a set (see package claimfloor): the transactions p_running,
-- each below p_floor, and every row from (p_floor, p_seq) on, in
-- (xact_id, seq) order: a floor proper that is a position, not a
-- transaction, so that claims of a backlog that one transaction recorded
-- start where the last claim ended, not at its first row (each would step
-- over the entries of every row stamped since, which a held snapshot keeps
-- from being marked dead). Each running transaction is a probe of
-- outbox_events_claim_floor_idx, and rows come in (xact_id, seq) order, as
-- from 016's functions: the running transactions' first (they are all below
-- p_floor), then the scan from p_floor, which a CTE scan reads only as far
-- as the LIMIT asks (none of it when the first filled the batch). CTEs, as
-- FOR UPDATE is not allowed in a UNION's branches. It returns the rows it
-- locked, not their seqs for the caller to join back to outbox_events
-- (016's do): the function's query takes a snapshot of its own, later than
-- the calling statement's, and a join on the older one drops the rows of
-- a transaction that committed between the two. The claim then looked
-- short although it filled its batch, and the floor passed transactions it
-- never reached. 016's functions stay, for relays of the release
-- before during a deploy.
CREATE FUNCTION outbox_claim_from(p_floor xid8, p_seq bigint, p_running xid8[], p_limit integer)
RETURNS TABLE (seq bigint, id uuid, type text, subject text, scope text, payload jsonb,
               created_at timestamptz, attempts integer, trace_context jsonb, xact_id xid8)
LANGUAGE sql VOLATILE
ROWS 10
SET enable_sort = off
SET search_path FROM CURRENT
AS $$
    WITH running AS (
        SELECT e.seq, e.id, e.type, e.subject, e.scope, e.payload, e.created_at, e.attempts, e.trace_context, e.xact_id
          FROM outbox_events e
         WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.attempts = 0
           AND e.xact_id = ANY(p_running)
         ORDER BY e.xact_id, e.seq LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    ), from_floor AS (
        SELECT e.seq, e.id, e.type, e.subject, e.scope, e.payload, e.created_at, e.attempts, e.trace_context, e.xact_id
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

CREATE FUNCTION outbox_pending_from(p_floor xid8, p_seq bigint, p_running xid8[])
RETURNS boolean
LANGUAGE sql STABLE
SET enable_sort = off
SET search_path FROM CURRENT
AS $$
    SELECT (SELECT e.xact_id FROM outbox_events e
             WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.attempts = 0
               AND e.xact_id = ANY(p_running)
             ORDER BY e.xact_id LIMIT 1) IS NOT NULL
        OR (SELECT e.xact_id FROM outbox_events e
             WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.attempts = 0
               AND (e.xact_id, e.seq) > (p_floor, p_seq)
             ORDER BY e.xact_id, e.seq LIMIT 1) IS NOT NULL
$$;

-- 016's look below the floor, up to the floor's position (p_below,
-- p_seq), and over the transactions p_dropped (running transactions that
-- the floor read and no longer reads), but for the transactions the claims
-- read (p_skip): a row of one of them is pending for the claims to take,
-- and lowering the floor to it would make them walk down to it.
CREATE FUNCTION outbox_pending_below(p_from xid8, p_below xid8, p_seq bigint, p_dropped xid8[], p_skip xid8[])
RETURNS xid8
LANGUAGE sql VOLATILE
SET enable_sort = off
SET search_path FROM CURRENT
AS $$
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
            FOR UPDATE SKIP LOCKED))
$$;
