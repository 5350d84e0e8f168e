-- Version 0.2.0, step 3: delivery state per (event, subscriber).
--
-- The promise is per (event, subscriber), so the state is too. The common
-- path is unchanged: a round that fans an event out to every subscriber
-- stamps fanned_out_at and fanout on the event row and writes nothing else.
-- Only a pair that is still owed has a row here: one whose subscriber's Map
-- failed (it waits for its retry, or is poisoned), one owed to a registered
-- subscriber the stamping relay does not know (a rolling deploy), one owed
-- to a paused subscriber. A pair's job is inserted and its row deleted (and
-- the event's fanout extended) in one transaction: exactly once per pair.
--
-- Online: new tables and their indexes are built empty; columns added to the
-- small registry take no rewrite; outbox_events gets no new index. The
-- catch_up rows of 0.1.0 are carried over in one statement that locks only
-- them (the GIN index finds them).

CREATE TABLE outbox_deliveries (
    event_seq       bigint      NOT NULL,
    subscriber      text        NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    poisoned_at     timestamptz,
    last_error      text,
    -- The last 10 failed attempts, oldest first: [{"at": …, "error": …}].
    -- Kept across a requeue, so why a pair was poisoned is never lost.
    errors          jsonb       NOT NULL DEFAULT '[]',
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_seq, subscriber)
);

-- The deliveries lane: owed pairs of the subscribers a relay knows, due
-- first.
CREATE INDEX outbox_deliveries_due_idx ON outbox_deliveries (subscriber, next_attempt_at)
    WHERE poisoned_at IS NULL;

-- Poisoned pairs, most recently poisoned first.
CREATE INDEX outbox_deliveries_poisoned_idx ON outbox_deliveries (poisoned_at DESC, event_seq DESC)
    WHERE poisoned_at IS NOT NULL;

-- The registry learns each subscriber's type globs (as the regular
-- expression of internal/glob, matched against '.' || type), so that any
-- relay can tell whether an event it stamps is owed to a subscriber it does
-- not know; when each was last served by a running relay (heartbeats), for
-- orphan detection; and whether an operator paused it.
ALTER TABLE outbox_subscribers
    ADD COLUMN types          text[],
    ADD COLUMN types_regexp   text,
    ADD COLUMN last_served_at timestamptz,
    ADD COLUMN paused_at      timestamptz,
    -- events.Backfill's progress: owing events created since backfill_since,
    -- done up to backfill_seq (resumable), finished at backfill_done_at.
    ADD COLUMN backfill_since   timestamptz,
    ADD COLUMN backfill_seq     bigint,
    ADD COLUMN backfill_done_at timestamptz;
-- Subscribers registered before heartbeats existed count as served now:
-- they are orphaned only if no relay serves them from here on.
UPDATE outbox_subscribers SET last_served_at = now() WHERE retired_at IS NULL;

-- The running relays, each written every few seconds by the relay itself,
-- outside any host transaction: what it serves, and how it fares.
CREATE TABLE outbox_relays (
    id                   uuid        PRIMARY KEY,
    host                 text        NOT NULL DEFAULT '',
    pid                  integer     NOT NULL DEFAULT 0,
    version              text        NOT NULL DEFAULT '',
    subscribers          text[]      NOT NULL DEFAULT '{}',
    started_at           timestamptz NOT NULL DEFAULT now(),
    last_seen_at         timestamptz NOT NULL DEFAULT now(),
    stopped_at           timestamptz,
    listening            boolean     NOT NULL DEFAULT false,
    poll_only            boolean     NOT NULL DEFAULT false,
    consecutive_failures integer     NOT NULL DEFAULT 0,
    last_round_at        timestamptz
);

-- Moves up to max_rows events' catch_up lists (written by relays of 0.1.0,
-- which know no deliveries table) into owed pairs, in one statement: the
-- rows are locked, their names that are still registered and active become
-- pairs, catch_up is cleared. A catch-up that 0.1.0 charged and poisoned
-- becomes a poisoned pair: the event itself was fanned out, so it is no
-- longer poisoned. Returns how many events it converted. Relays run it in
-- their deliveries lane, so old relays still writing catch_up during a
-- deploy are served too.
CREATE FUNCTION outbox_convert_catch_up(max_rows integer)
RETURNS bigint
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
WITH doomed AS (
    SELECT seq, catch_up, attempts, last_error, poisoned_at FROM outbox_events
     WHERE catch_up && (SELECT coalesce(array_agg(name), '{}') FROM outbox_subscribers)
       AND catch_up IS NOT NULL
     ORDER BY seq LIMIT max_rows
       FOR UPDATE SKIP LOCKED),
pairs AS (
    INSERT INTO outbox_deliveries (event_seq, subscriber, attempts, poisoned_at, last_error, errors)
    SELECT d.seq, n.name, CASE WHEN d.poisoned_at IS NOT NULL THEN d.attempts ELSE 0 END, d.poisoned_at,
           CASE WHEN d.poisoned_at IS NOT NULL THEN d.last_error END,
           CASE WHEN d.poisoned_at IS NOT NULL AND d.last_error IS NOT NULL
                THEN jsonb_build_array(jsonb_build_object('at', d.poisoned_at, 'error', d.last_error)) ELSE '[]' END
      FROM doomed d
     CROSS JOIN LATERAL unnest(d.catch_up) AS n(name)
      JOIN outbox_subscribers s ON s.name = n.name AND s.retired_at IS NULL
    ON CONFLICT (event_seq, subscriber) DO NOTHING),
cleared AS (
    UPDATE outbox_events e
       SET catch_up = NULL,
           poisoned_at = CASE WHEN e.fanned_out_at IS NOT NULL THEN NULL ELSE e.poisoned_at END,
           attempts = CASE WHEN e.fanned_out_at IS NOT NULL THEN 0 ELSE e.attempts END,
           next_attempt_at = CASE WHEN e.fanned_out_at IS NOT NULL THEN NULL ELSE e.next_attempt_at END
      FROM doomed d WHERE e.seq = d.seq
    RETURNING 1)
SELECT count(*) FROM cleared
$$;

-- Carry 0.1.0's catch_up data over.
SELECT outbox_convert_catch_up(2147483647);

-- Stats learn the pairs: owed, poisoned, and the events with a poisoned
-- pair (no event poisoned as a whole has pairs: pairs are written when an
-- event is fanned out).
CREATE FUNCTION outbox_delivery_stats(OUT owed bigint, OUT poisoned bigint, OUT poisoned_events bigint)
LANGUAGE sql
STABLE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
SELECT
    (SELECT count(*) FROM outbox_deliveries WHERE poisoned_at IS NULL),
    (SELECT count(*) FROM outbox_deliveries WHERE poisoned_at IS NOT NULL),
    (SELECT count(DISTINCT event_seq) FROM outbox_deliveries WHERE poisoned_at IS NOT NULL)
$$;
