-- Back to version 020: the functions as SQL functions again, as 004, 011,
-- 016, 018 and 020 defined them; the stamp is the relay's statement again.
DROP FUNCTION IF EXISTS outbox_stamp(bigint[], text[], text[], smallint[]);
CREATE OR REPLACE FUNCTION outbox_claim_rows(p_floor xid8, p_seq bigint, p_running xid8[], p_limit integer)
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

CREATE OR REPLACE FUNCTION outbox_pending_from(p_floor xid8, p_seq bigint, p_running xid8[])
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

CREATE OR REPLACE FUNCTION outbox_pending_below(p_from xid8, p_below xid8, p_seq bigint, p_dropped xid8[], p_skip xid8[])
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

CREATE OR REPLACE FUNCTION outbox_retry_next()
RETURNS timestamptz
LANGUAGE sql STABLE
SET enable_sort = off
SET search_path FROM CURRENT
AS $$
    SELECT e.next_attempt_at FROM outbox_events e
     WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.attempts > 0
     ORDER BY e.next_attempt_at LIMIT 1
$$;

CREATE OR REPLACE FUNCTION outbox_claim_due(p_limit integer)
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

CREATE OR REPLACE FUNCTION outbox_chain_blockers(subs text[], subjects text[], max_seqs bigint[], res text[], blocks boolean[],
    claimed bigint[], pair_seqs bigint[], pair_subs text[])
RETURNS TABLE (subscriber text, subject text, blocker_seq bigint, blocker_due timestamptz)
LANGUAGE sql
STABLE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
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
     ORDER BY x.seq LIMIT 1) b ON true
$$;

CREATE OR REPLACE FUNCTION outbox_stats(
    OUT pending bigint, OUT retrying bigint, OUT poisoned bigint, OUT catching_up bigint,
    OUT fanned_last_minute bigint, OUT lag_seconds double precision)
LANGUAGE sql
STABLE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
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
$$;
