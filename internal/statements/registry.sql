-- The subscriber registry, backfill, and the heartbeats of running relays.

-- name: Register
-- $1 names, $2 their type globs (comma-separated: a glob has no comma), $3
-- the globs' regular expression; returns the names that are retired.
-- Registering locks nothing that exists unless its types changed: an INSERT
-- … ON CONFLICT DO UPDATE would lock every existing row, and FanOutTx
-- registers inside the caller's transaction, where a lock on a shared row
-- would hold every other relay's Start until that commits. last_served_at is
-- the heartbeat's (it beats at once on Start).
WITH u AS (
    SELECT name, string_to_array(types, ',') AS types, re
      FROM unnest($1::text[], $2::text[], $3::text[]) AS u(name, types, re)),
ins AS (
    INSERT INTO /* TEMPLATE: schema */outbox_subscribers (name, types, types_regexp, last_served_at)
    SELECT name, types, re, now() FROM u
    ON CONFLICT (name) DO NOTHING),
upd AS (
    UPDATE /* TEMPLATE: schema */outbox_subscribers AS s
       SET types = coalesce(u.types, s.types), types_regexp = coalesce(u.re, s.types_regexp)
      FROM u
     WHERE s.name = u.name AND s.retired_at IS NULL
       AND (coalesce(u.types, s.types) IS DISTINCT FROM s.types OR coalesce(u.re, s.types_regexp) IS DISTINCT FROM s.types_regexp))
SELECT name FROM /* TEMPLATE: schema */outbox_subscribers
 WHERE name = ANY($1::text[]) AND retired_at IS NOT NULL
 ORDER BY name;

-- name: Retire
-- $1 name. The row is locked FOR UPDATE first: that waits for every stamp
-- that read it (FOR KEY SHARE) and makes later ones see it retired.
WITH l AS (
    SELECT name FROM /* TEMPLATE: schema */outbox_subscribers WHERE name = $1 FOR UPDATE),
r AS (
    UPDATE /* TEMPLATE: schema */outbox_subscribers AS s
       SET retired_at = coalesce(s.retired_at, now()), paused_at = NULL
      FROM l WHERE s.name = l.name
    RETURNING s.name)
SELECT EXISTS (SELECT 1 FROM r);

-- name: RetireDeliveries
-- Deletes, in batches of $2, the pairs still owed to the retired subscriber
-- $1.
WITH d AS (
    DELETE FROM /* TEMPLATE: schema */outbox_deliveries
     WHERE (event_seq, subscriber) IN (
           SELECT event_seq, subscriber FROM /* TEMPLATE: schema */outbox_deliveries WHERE subscriber = $1 LIMIT $2)
    RETURNING 1)
SELECT count(*) FROM d;

-- name: RetireCatchUp
-- As RetireDeliveries, for the catch_up lists 0.1.0 relays write.
WITH c AS (
    UPDATE /* TEMPLATE: schema */outbox_events SET catch_up = nullif(array_remove(catch_up, $1), '{}')
     WHERE seq IN (SELECT seq FROM /* TEMPLATE: schema */outbox_events
                    WHERE catch_up @> ARRAY[$1]::text[] AND catch_up IS NOT NULL LIMIT $2)
    RETURNING 1)
SELECT count(*) FROM c;

-- name: Pause
UPDATE /* TEMPLATE: schema */outbox_subscribers SET paused_at = coalesce(paused_at, now())
 WHERE name = $1 AND retired_at IS NULL
RETURNING name;

-- name: Resume
WITH r AS (
    UPDATE /* TEMPLATE: schema */outbox_subscribers SET paused_at = NULL
     WHERE name = $1 AND retired_at IS NULL
    RETURNING name)
SELECT name, pg_notify(/* TEMPLATE_BEGIN: channel_events */'standmeet_events'/* TEMPLATE_END */, '') FROM r;

-- name: ListSubscribers
SELECT name, registered_at, retired_at, coalesce(types, '{}') AS types, last_served_at, paused_at,
       backfill_since, coalesce(backfill_seq, 0) AS backfill_seq, backfill_done_at
  FROM /* TEMPLATE: schema */outbox_subscribers
 ORDER BY name;

-- name: SubscriberRetired
-- An unregistered name counts as retired: no relay can serve it.
SELECT coalesce((SELECT retired_at IS NOT NULL FROM /* TEMPLATE: schema */outbox_subscribers WHERE name = $1), true);

-- name: BackfillStart
-- $1 subscriber, $2 since: whether the subscriber is active, whether its
-- types are known, where to resume, and the highest seq.
WITH reg AS (
    SELECT name, types_regexp IS NOT NULL AS typed,
           CASE WHEN backfill_since = $2 THEN coalesce(backfill_seq, 0) ELSE 0 END AS from_seq
      FROM /* TEMPLATE: schema */outbox_subscribers
     WHERE name = $1 AND retired_at IS NULL
       FOR UPDATE),
start AS (
    UPDATE /* TEMPLATE: schema */outbox_subscribers s
       SET backfill_since = $2, backfill_seq = reg.from_seq, backfill_done_at = NULL
      FROM reg WHERE s.name = reg.name AND reg.typed)
SELECT EXISTS (SELECT 1 FROM reg), coalesce((SELECT typed FROM reg), false), coalesce((SELECT from_seq FROM reg), 0),
       coalesce((SELECT max(seq) FROM /* TEMPLATE: schema */outbox_events), 0);

-- name: BackfillBatch
-- $1 subscriber, $2 since, $3 after seq, $4 up to seq: owes the subscriber
-- the matching fanned-out events of that range it has not got. The event
-- rows are locked FOR KEY SHARE: a deliveries round or a stamp holding one
-- (FOR UPDATE) is waited for and the row re-read, so a pair delivered
-- meanwhile is seen in its fanout; retention skips the rows held. The
-- registry row is read FOR KEY SHARE, as by a stamp.
WITH reg AS (
    SELECT name, types_regexp FROM /* TEMPLATE: schema */outbox_subscribers
     WHERE name = $1 AND retired_at IS NULL AND types_regexp IS NOT NULL
       FOR KEY SHARE),
ev AS (
    SELECT e.seq FROM /* TEMPLATE: schema */outbox_events e, reg
     WHERE e.seq > $3 AND e.seq <= $4 AND e.created_at >= $2 AND e.fanned_out_at IS NOT NULL
       AND ('.' || e.type) ~ reg.types_regexp AND NOT (coalesce(e.fanout, '{}') ? $1::text)
       FOR KEY SHARE OF e),
ins AS (
    INSERT INTO /* TEMPLATE: schema */outbox_deliveries (event_seq, subscriber) SELECT seq, $1 FROM ev
    ON CONFLICT (event_seq, subscriber) DO NOTHING
    RETURNING 1),
progress AS (
    UPDATE /* TEMPLATE: schema */outbox_subscribers SET backfill_seq = $4 WHERE name = $1 AND backfill_since = $2)
SELECT EXISTS (SELECT 1 FROM reg), (SELECT count(*) FROM ins),
       (SELECT pg_notify(/* TEMPLATE_BEGIN: channel_events */'standmeet_events'/* TEMPLATE_END */, ''));

-- name: BackfillDone
UPDATE /* TEMPLATE: schema */outbox_subscribers SET backfill_done_at = now() WHERE name = $1 AND backfill_since = $2;

-- name: Heartbeat
-- $1 relay id, $2 host, $3 pid, $4 version, $5 subscribers served, $6
-- listening, $7 poll only, $8 consecutive failures, $9 last
-- round, $10 OrphanAfter in µs, $11 the River client's ID, $12 its claim
-- floor (NULL: none yet). The run starts
-- at its first heartbeat, on the server's clock, as River's attempted_at is:
-- ChainRescue compares them. It also marks the subscribers served (those no
-- one else holds), forgets relays not seen for a day, and returns the
-- orphaned subscribers: registered, active, served by no relay for
-- OrphanAfter (as Stats counts them), other than its own.
WITH hb AS (
    INSERT INTO /* TEMPLATE: schema */outbox_relays AS r
           (id, host, pid, version, subscribers, started_at, last_seen_at, listening, poll_only, consecutive_failures, last_round_at,
            river_client_id, claim_floor)
    VALUES ($1, $2, $3, $4, $5::text[], now(), now(), $6, $7, $8, $9, $11, $12::bigint::text::xid8)
    ON CONFLICT (id) DO UPDATE
       SET last_seen_at = now(), subscribers = EXCLUDED.subscribers, listening = EXCLUDED.listening,
           consecutive_failures = EXCLUDED.consecutive_failures, last_round_at = EXCLUDED.last_round_at, stopped_at = NULL,
           claim_floor = EXCLUDED.claim_floor),
-- A registry row another transaction holds (an operator's
-- RetireSubscriber, however long it lasts) is skipped this time, never
-- waited for: the heartbeat is what tells the relays that this process is
-- alive (ChainRescue), and must land whatever holds the registry. FOR NO KEY
-- UPDATE, as the UPDATE itself locks, so the rounds' FOR KEY SHARE does not
-- make it skip.
served AS (
    UPDATE /* TEMPLATE: schema */outbox_subscribers SET last_served_at = now()
     WHERE name IN (SELECT name FROM /* TEMPLATE: schema */outbox_subscribers
                     WHERE name = ANY($5::text[]) AND retired_at IS NULL FOR NO KEY UPDATE SKIP LOCKED)),
gone AS (
    DELETE FROM /* TEMPLATE: schema */outbox_relays WHERE last_seen_at < now() - interval '1 day')
SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM /* TEMPLATE: schema */outbox_subscribers
 WHERE retired_at IS NULL AND coalesce(last_served_at, registered_at) < now() - $10::bigint * interval '1 microsecond'
   AND NOT (name = ANY($5::text[]));

-- name: RelayStopped
-- $1 relay id, $2 its claim floor (NULL: keep the last one written). A run
-- already marked stopped keeps the time it stopped.
UPDATE /* TEMPLATE: schema */outbox_relays SET stopped_at = now(), last_seen_at = now(), listening = false,
       claim_floor = coalesce($2::bigint::text::xid8, claim_floor)
 WHERE id = $1 AND stopped_at IS NULL;

-- name: ClaimFloors
-- The highest claim floor of the relays of the last day (NULL: none), where
-- a new run's claims start (see claimfloor).
SELECT max(claim_floor::text::bigint) FROM /* TEMPLATE: schema */outbox_relays;

-- name: ListRelays
SELECT id, host, pid, version, subscribers, started_at, last_seen_at, stopped_at, listening, poll_only,
       consecutive_failures, last_round_at
  FROM /* TEMPLATE: schema */outbox_relays
 ORDER BY started_at, id;
