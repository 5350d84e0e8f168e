-- Back to version 010: 008's outbox_chain_blockers and prepare, the claim
-- index of 006, no subject on owed pairs.
DROP FUNCTION outbox_chain_prepare(text[], text[], bigint[], bigint[], text[], boolean[], bigint[], bigint[], bigint[], text[], integer);
ALTER TABLE outbox_relays DROP COLUMN river_client_id;
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
pr AS MATERIALIZED (
    SELECT d.event_seq AS seq, d.subscriber AS sub, e.subject, d.poisoned, d.due FROM (
        SELECT event_seq, subscriber, false AS poisoned, next_attempt_at AS due FROM outbox_deliveries
         WHERE subscriber = ANY(subs) AND poisoned_at IS NULL
        UNION ALL
        SELECT event_seq, subscriber, true, NULL FROM outbox_deliveries
         WHERE poisoned_at IS NOT NULL AND subscriber = ANY(subs)) d
      JOIN outbox_events e ON e.seq = d.event_seq
     WHERE e.subject = ANY(subjects)
       AND NOT EXISTS (SELECT 1 FROM unnest(pair_seqs, pair_subs) AS p(seq, sub) WHERE p.seq = d.event_seq AND p.sub = d.subscriber))
SELECT ch.sub, ch.subj, b.seq, b.due
  FROM ch LEFT JOIN LATERAL (
    SELECT x.seq, x.due FROM (
        SELECT ev.seq, ev.due FROM ev WHERE ev.subject = ch.subj AND ev.seq < ch.max_seq AND ('.' || ev.type) ~ ch.re
        UNION ALL
        SELECT pr.seq, pr.due FROM pr WHERE pr.sub = ch.sub AND pr.subject = ch.subj AND pr.seq < ch.max_seq
           AND (ch.block OR NOT pr.poisoned)) x
     ORDER BY x.seq LIMIT 1) b ON true
$$;

CREATE INDEX outbox_deliveries_due_idx ON outbox_deliveries (subscriber, next_attempt_at)
    WHERE poisoned_at IS NULL;
DROP INDEX outbox_deliveries_claim_idx;
DROP INDEX outbox_deliveries_chain_idx;
DROP TRIGGER outbox_deliveries_subject ON outbox_deliveries;
DROP FUNCTION outbox_deliveries_subject();
ALTER TABLE outbox_deliveries DROP COLUMN subject;
