-- Claims that do not step over the dead index entries of everything fanned
-- out since the oldest snapshot (issue 31). A held snapshot (a long report,
-- pg_dump, a standby's hot_standby_feedback) keeps VACUUM from removing the
-- versions that the stamps leave behind, and a claim ordered by seq walks
-- every one of them in outbox_events_pending_idx. Each event already
-- remembers the (top-level) transaction that recorded it (xact_id, since
-- 002), and the relays claim from a floor: events recorded by transactions
-- still running at their previous claim, or younger (see package claimfloor).
-- A late commit always lands above every relay's floor, since its
-- transaction was running. Version 017 builds the index, concurrently: until
-- it is valid, these functions read the pending index.
--
-- The claims and looks from a floor, as functions for one reason: the
-- planner. Statistics count few pending rows, and nothing tells it how
-- many dead entries a held snapshot leaves in outbox_events_pending_idx, so
-- a plan (generic ones especially) would as soon read that index and sort
-- as start at the floor in outbox_events_claim_floor_idx: the very walk the
-- floor is for. With sorting priced out (enable_sort = off, for these
-- queries only), the plan that gives (xact_id, seq) order without a sort, the
-- floor index, is the one chosen; without the index (017 not built yet) the
-- sort is still done. ROWS 10: the claim joins the rows it returns to
-- outbox_events by seq, and at the default estimate (1,000 rows) the planner
-- hashed the whole table for it (a sequential scan of every row, live and
-- dead, on the claims that took that plan); a claim's rows are
-- looked up by primary key.
CREATE FUNCTION outbox_claim_from(p_floor xid8, p_limit integer)
RETURNS TABLE (seq bigint)
LANGUAGE sql VOLATILE
ROWS 10
SET enable_sort = off
SET search_path FROM CURRENT
AS $$
    SELECT e.seq FROM outbox_events e
     WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.attempts = 0 AND e.xact_id >= p_floor
     ORDER BY e.xact_id, e.seq LIMIT p_limit
       FOR UPDATE SKIP LOCKED
$$;

CREATE FUNCTION outbox_pending_from(p_floor xid8)
RETURNS boolean
LANGUAGE sql STABLE
SET enable_sort = off
SET search_path FROM CURRENT
AS $$
    SELECT (SELECT e.xact_id FROM outbox_events e
             WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.attempts = 0 AND e.xact_id >= p_floor
             ORDER BY e.xact_id LIMIT 1) IS NOT NULL
$$;

-- The first transaction, from p_from up to (not including) p_below, of a
-- pending row that no round holds: a row below a relay's floor that a
-- rolled-back round let go of, or whose round's commit a crash lost. The
-- relay looks for one on a goroutine of its own and lowers its floor to
-- it. FOR UPDATE SKIP LOCKED, as a claim: it passes over the rows a round
-- holds (those are being fanned out) and over any a claim would skip (a
-- host transaction's lock on the row: lowering the floor to it would only
-- make the claims walk down to it, again and again). The lock it takes on
-- the row it returns ends with the look's transaction.
CREATE FUNCTION outbox_pending_below(p_from xid8, p_below xid8)
RETURNS xid8
LANGUAGE sql VOLATILE
SET enable_sort = off
SET search_path FROM CURRENT
AS $$
    SELECT e.xact_id FROM outbox_events e
     WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.attempts = 0
       AND e.xact_id >= p_from AND e.xact_id < p_below
     ORDER BY e.xact_id LIMIT 1
       FOR UPDATE SKIP LOCKED
$$;

-- Each relay's floor, written with its heartbeats and when it stops: a
-- relay that starts claims from the highest one (rows below it were claimed
-- by then; its look from the start, at once, finds any that were not), so
-- that a new process, a deploy's, does not first walk every dead entry
-- from transaction 0. Nullable, no default: no rewrite, an instant's lock.
ALTER TABLE outbox_relays ADD COLUMN claim_floor xid8;

-- When the next failed event's retry is due (NULL: none), for an idle
-- relay's poll, through outbox_events_retry_idx. Asked as min(), the
-- planner, counting few pending rows, read outbox_events_pending_idx and
-- filtered (the min over a handful of rows costs about the same either way
-- by the statistics): under a held snapshot, every dead entry, at every
-- poll. With sorting priced out, only the index in next_attempt_at order
-- answers ORDER BY ... LIMIT 1 cheaply.
CREATE FUNCTION outbox_retry_next()
RETURNS timestamptz
LANGUAGE sql STABLE
SET enable_sort = off
SET search_path FROM CURRENT
AS $$
    SELECT e.next_attempt_at FROM outbox_events e
     WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.attempts > 0
     ORDER BY e.next_attempt_at LIMIT 1
$$;

-- The claim of failed events whose retry is due, through
-- outbox_events_retry_idx, for the same reason as outbox_retry_next: the
-- planner read the pending index filtered, and sorted (under a held
-- snapshot, every dead entry, several times a second on a busy relay).
CREATE FUNCTION outbox_claim_due(p_limit integer)
RETURNS TABLE (seq bigint)
LANGUAGE sql VOLATILE
ROWS 10
SET enable_sort = off
SET search_path FROM CURRENT
AS $$
    SELECT e.seq FROM outbox_events e
     WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.attempts > 0 AND e.next_attempt_at <= now()
     ORDER BY e.next_attempt_at LIMIT p_limit
       FOR UPDATE SKIP LOCKED
$$;
