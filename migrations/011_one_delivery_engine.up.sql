-- One delivery engine (issue 33): a round's cost is bounded by its batch,
-- not by how many pairs are owed.
--
-- * Owed pairs carry their event's subject, so that an ordered round asks
--   only its chains' own pairs whether an earlier event is still owed (an
--   index on (subscriber, subject, event_seq)) instead of reading every
--   pair owed to the subscriber. A BEFORE INSERT trigger fills it from the
--   event, so every writer — this release's statements, outbox_convert_catch_up,
--   and relays of an older release during a rolling deploy — writes it.
-- * The claim index gains event_seq: a subscriber's due pairs are read in
--   (next_attempt_at, event_seq) order straight from the index, one
--   subscriber at a time, with no sort over every due pair.
--
-- Online: the column is added without a default (no rewrite); outbox_deliveries
-- holds only owed pairs, so its UPDATE and index builds are short;
-- outbox_events is not touched.

ALTER TABLE outbox_deliveries ADD COLUMN subject text;

CREATE FUNCTION outbox_deliveries_subject()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NEW.subject IS NULL THEN
        SELECT e.subject INTO NEW.subject FROM outbox_events e WHERE e.seq = NEW.event_seq;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER outbox_deliveries_subject BEFORE INSERT ON outbox_deliveries
    FOR EACH ROW EXECUTE FUNCTION outbox_deliveries_subject();

UPDATE outbox_deliveries d SET subject = e.subject
  FROM outbox_events e
 WHERE e.seq = d.event_seq AND d.subject IS NULL;

CREATE INDEX outbox_deliveries_claim_idx ON outbox_deliveries (subscriber, next_attempt_at, event_seq)
    WHERE poisoned_at IS NULL;
DROP INDEX outbox_deliveries_due_idx;

CREATE INDEX outbox_deliveries_chain_idx ON outbox_deliveries (subscriber, subject, event_seq);

-- As in 008, but an owed pair is looked up per chain, in the chain index,
-- from the chain's first owed event: the cost is the chain's, not the
-- subscriber's backlog.
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

-- outbox_chain_prepare with min_seqs, each chain's first event in the
-- round: as 008's, but the round waits only for blockers below its own
-- first event of a chain. Two rounds whose claims interleave within a
-- subject (concurrent SKIP LOCKED claims do) no longer wait for each other
-- until the lock times out and both defer: the round that holds the
-- earlier event appends up to the other's first one without waiting, and
-- the other waits for it. Whatever the wait, the cut after it is the same
-- (every blocker below a chain's last event counts), so the order holds.
-- It also returns tail_seq, the event the chain's pending tail carries: a
-- coalescing subscriber's newer event replaces that job's only when it is
-- later (a higher seq); an earlier one whose transaction committed late
-- gets a job of its own. 008's signature stays for relays of the previous
-- release during a rolling deploy.
CREATE FUNCTION outbox_chain_prepare(subs text[], subjects text[], min_seqs bigint[], max_seqs bigint[], res text[], blocks boolean[],
    counts bigint[], claimed bigint[], pair_seqs bigint[], pair_subs text[], wait_ms integer)
RETURNS TABLE (subscriber text, subject text, head_job bigint, tail_job bigint, next_pos bigint, blocked boolean,
    blocker_seq bigint, blocker_due timestamptz, tail_kind text, tail_seq bigint)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    seqs bigint[];
    old_timeout text;
BEGIN
    SELECT array_agg(b.blocker_seq) INTO seqs
      FROM outbox_chain_blockers(subs, subjects, min_seqs, res, blocks, claimed, pair_seqs, pair_subs) b
     WHERE b.blocker_seq IS NOT NULL;
    IF seqs IS NOT NULL AND wait_ms > 0 THEN
        old_timeout := current_setting('lock_timeout');
        BEGIN
            PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
            PERFORM 1 FROM outbox_events WHERE seq = ANY(seqs) FOR KEY SHARE;
            PERFORM set_config('lock_timeout', old_timeout, true);
        EXCEPTION WHEN lock_not_available THEN
            NULL; -- still held: the blocker stays a blocker
        END;
    END IF;
    RETURN QUERY
    WITH up AS (
        INSERT INTO outbox_chains AS c (subscriber, subject, next_pos)
        SELECT u.sub, u.subj, u.n FROM unnest(subs, subjects, counts) AS u(sub, subj, n) ORDER BY u.sub, u.subj
        ON CONFLICT ON CONSTRAINT outbox_chains_pkey DO UPDATE SET next_pos = c.next_pos + EXCLUDED.next_pos
        RETURNING c.subscriber, c.subject, c.head_job, c.tail_job, c.next_pos, c.blocked_at IS NOT NULL AS blocked)
    SELECT up.subscriber, up.subject, up.head_job, up.tail_job, up.next_pos, up.blocked, b.blocker_seq, b.blocker_due,
        (SELECT j.kind FROM river_job j WHERE j.id = up.tail_job AND up.tail_job IS DISTINCT FROM up.head_job AND j.state = 'pending'),
        (SELECT l.event_seq FROM outbox_chain_jobs l WHERE l.job_id = up.tail_job)
      FROM up JOIN outbox_chain_blockers(subs, subjects, max_seqs, res, blocks, claimed, pair_seqs, pair_subs) b
        ON b.subscriber = up.subscriber AND b.subject = up.subject;
END
$$;

-- The River client each running relay was started with: a chain's head
-- running on a client whose process stopped heartbeating (it died: its
-- relay's row was never marked stopped) is given back to River by the
-- relays' sweep within a minute, instead of waiting for River's rescuer
-- (an hour by default). A process with no relay never counts as dead.
ALTER TABLE outbox_relays ADD COLUMN river_client_id text;
CREATE INDEX outbox_relays_client_idx ON outbox_relays (river_client_id) WHERE river_client_id IS NOT NULL;
