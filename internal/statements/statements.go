// Package statements builds, once per schema, every SQL statement the
// library runs, and the schema's notification channels. It is the one place
// where table names meet SQL: Record, the relay, the awaiter and the
// operator functions all take their statements from a Set.
package statements

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Notification channels of the default schema (the connection's
// search_path). In a named schema they are qualified: see Channel.
const (
	ChannelEvents = "standmeet_events"
	ChannelFanned = "standmeet_events_fanned"
)

// Table names, unqualified.
const (
	EventsTable      = "outbox_events"
	SubscribersTable = "outbox_subscribers"
	DeliveriesTable  = "outbox_deliveries"
	RelaysTable      = "outbox_relays"
)

// Set is the statements of one schema. Every field is read-only.
type Set struct {
	Schema string
	// ChannelEvents and ChannelFanned are the schema's channels.
	ChannelEvents, ChannelFanned string
	// WatchFunction is the trigger function of watches, qualified.
	WatchFunction string

	// Recording: with the relays' notification, and without (the
	// transaction's notification was throttled).
	Record, RecordNotify, RecordMany, RecordManyNotify, RecordedInTx string

	// The relay's rounds: the pending lane (events not yet fanned out) and
	// the deliveries lane (owed pairs of subscribers the relay knows).
	ClaimBatch, ClaimOne, ClaimDue string
	ClaimOwed, ClaimOwedOne        string
	Poll, Stamp, StampOwed         string
	Charge, ChargeDeliveries, Load string
	ConvertCatchUp                 string
	NotifyFanned                   string
	// NotifyEvents wakes the relays, outside any host transaction (an
	// awaiter's kick).
	NotifyEvents string

	// The subscriber registry. RetireDeliveries and RetireCatchUp delete,
	// in batches of $2, what is still owed to the retired subscriber $1.
	Register, Retire, ListSubscribers, SubscriberRetired string
	RetireDeliveries, RetireCatchUp                      string
	Pause, Resume                                        string

	// Backfill: BackfillStart ($1 subscriber, $2 since) returns whether the
	// subscriber is active with known types, where to resume, and the
	// highest seq; BackfillBatch ($1 subscriber, $2 since, $3 after seq,
	// $4 up to seq) owes it the matching fanned-out events of that range it
	// has not got; BackfillDone marks it finished.
	BackfillStart, BackfillBatch, BackfillDone string

	// Heartbeats of running relays.
	Heartbeat, RelayStopped, ListRelays string

	// Per-pair operator statements.
	DeliveriesOf, ListDeliveries         string
	RequeueDelivery, DiscardDelivery     string
	RequeueDeliveries, DiscardDeliveries string

	// Receipts and operators.
	Await, AwaitDone, Inspect, Requeue string
	Discard, Stats                     string

	// Retention: Prune deletes up to $2 fanned-out rows older than $1 µs.
	Prune string

	// List pages through events by state: $1 limit, $2 type regexp (see
	// glob.Pattern.Regexp) or NULL, $3 subject or NULL, $4 and $5 the
	// cursor (seq, and the ordering time where the order has one) or NULL.
	List map[string]string
}

var (
	schemaRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
	cache    sync.Map // schema -> *Set
)

// ErrSchema is the reason For refuses a schema name.
var ErrSchema = fmt.Errorf("must be at most 63 letters, digits and underscores, starting with a letter or underscore")

// For returns the statements of schema ("" for the search_path), built on
// first use and shared afterwards.
func For(schema string) (*Set, error) {
	if s, ok := cache.Load(schema); ok {
		return s.(*Set), nil
	}
	if schema != "" && (len(schema) > 63 || !schemaRE.MatchString(schema)) {
		return nil, ErrSchema
	}
	s, _ := cache.LoadOrStore(schema, build(schema))
	return s.(*Set), nil
}

// Channel returns base qualified by schema, as River qualifies its channels,
// so that relays of one schema are not woken by another's writes. A name too
// long for PostgreSQL (63 bytes) uses a hash of the schema instead.
func Channel(schema, base string) string {
	if schema == "" {
		return base
	}
	if ch := schema + "." + base; len(ch) <= 63 {
		return ch
	}
	sum := sha256.Sum256([]byte(schema))
	return hex.EncodeToString(sum[:8]) + "." + base
}

// qualify returns the quoted name of a table in schema, or the bare name when
// schema is empty (the search_path decides).
func qualify(schema, name string) string {
	if schema == "" {
		return name
	}
	return pgx.Identifier{schema, name}.Sanitize()
}

// Literal quotes s as an SQL string literal, whatever
// standard_conforming_strings says: quotes are doubled, and a string with a
// backslash becomes an escape string (E prefix) with backslashes doubled.
// Callers have refused NUL bytes.
func Literal(s string) string {
	s = strings.ReplaceAll(s, "'", "''")
	if strings.Contains(s, `\`) {
		return "E'" + strings.ReplaceAll(s, `\`, `\\`) + "'"
	}
	return "'" + s + "'"
}

func build(schema string) *Set {
	t := qualify(schema, EventsTable)
	subscribers := qualify(schema, SubscribersTable)
	deliveries := qualify(schema, DeliveriesTable)
	relays := qualify(schema, RelaysTable)
	s := &Set{
		Schema:        schema,
		ChannelEvents: Channel(schema, ChannelEvents),
		ChannelFanned: Channel(schema, ChannelFanned),
		WatchFunction: qualify(schema, "outbox_watch"),
	}
	notifyEvents := "pg_notify(" + Literal(s.ChannelEvents) + ", '')"

	// Recording. The NOTIFY rides on the INSERT: one round trip. Its payload
	// is constant so PostgreSQL folds a transaction's notifies into one.
	insertOne := `INSERT INTO ` + t + ` (id, type, subject, payload, trace_context, scope)
		VALUES ($1, $2, $3, $4::text::jsonb, $5::text::jsonb, $6)
		RETURNING seq, created_at`
	s.Record = insertOne
	s.RecordNotify = `WITH ins AS (` + insertOne + `) SELECT seq, created_at FROM ins, (SELECT ` + notifyEvents + `) n`
	// RETURNING order is not promised, so rows are matched back by ID. The
	// NOTIFY sits in a materialised CTE so it runs once, not once per row.
	// Arrays are passed as text[] so that every query exec mode can encode
	// them.
	insertMany := `INSERT INTO ` + t + ` (id, type, subject, payload, trace_context, scope)
			SELECT id::uuid, type, subject, payload::jsonb, $5::text::jsonb, scope
			  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $6::text[]) AS u(id, type, subject, payload, scope)
			RETURNING id, seq, created_at`
	s.RecordMany = insertMany
	s.RecordManyNotify = `WITH notify AS MATERIALIZED (SELECT ` + notifyEvents + `),
		ins AS (` + insertMany + `)
		SELECT ins.id, ins.seq, ins.created_at FROM ins CROSS JOIN notify`
	s.RecordedInTx = "SELECT seq, id, type, subject, scope, payload, created_at FROM " + t +
		" WHERE fanned_out_at IS NULL AND poisoned_at IS NULL AND xact_id = pg_current_xact_id_if_assigned() ORDER BY seq"

	// The relay. paused, read once per claim (an InitPlan on the small
	// registry), names the subscribers an operator paused: the round maps
	// nothing for them, and the stamp leaves their pairs owed.
	const claimColumns = "seq, id, type, subject, scope, payload, created_at, attempts, trace_context"
	pausedColumn := ", (SELECT array_agg(name) FROM " + subscribers + " WHERE paused_at IS NOT NULL AND retired_at IS NULL) AS paused"
	pending := "fanned_out_at IS NULL AND poisoned_at IS NULL"
	// charge records a failed attempt of a whole event ($1 seq, $2 error, $3
	// pause in µs, $4 MaxAttempts) and poisons the row at the last one: a
	// failure no subscriber's pair could be blamed for (its stamp failed). A
	// poisoning is announced on the fanned channel too: receipts waiting for
	// the event must learn it will not be fanned out.
	charge := func(where string) string {
		return "WITH c AS (UPDATE " + t + " SET attempts = attempts + 1, last_error = $2, next_attempt_at = now() + $3::bigint * interval '1 microsecond'," +
			" poisoned_at = CASE WHEN attempts + 1 >= $4 THEN now() END" +
			" WHERE seq = $1 AND " + where + " RETURNING id, poisoned_at IS NOT NULL AS poisoned)" +
			" SELECT poisoned, CASE WHEN poisoned THEN pg_notify(" + Literal(s.ChannelFanned) + ", id::text) END FROM c"
	}
	// Never "seq > cursor": a row whose transaction commits late has a lower
	// seq than rows already fanned out, and must still be found. Rows that
	// failed before wait for their retry time in ClaimDue.
	s.ClaimBatch = "SELECT " + claimColumns + pausedColumn + " FROM " + t + " WHERE " + pending +
		" AND attempts = 0 ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED"
	s.ClaimOne = "SELECT " + claimColumns + pausedColumn + " FROM " + t + " WHERE " + pending + " AND seq = $1 FOR UPDATE SKIP LOCKED"
	s.ClaimDue = "SELECT " + claimColumns + pausedColumn + " FROM " + t + " WHERE " + pending +
		" AND attempts > 0 AND next_attempt_at <= now() ORDER BY next_attempt_at, seq LIMIT $1 FOR UPDATE SKIP LOCKED"
	// The deliveries lane: owed pairs of the subscribers $1 the relay knows,
	// due, of subscribers neither retired nor paused, one row per pair with
	// its event; both rows locked (the event's fanout is extended), skipped
	// when another round holds either.
	owedColumns := "e.seq, e.id, e.type, e.subject, e.scope, e.payload, e.created_at, d.attempts, e.trace_context, d.subscriber"
	owed := " FROM " + deliveries + " d JOIN " + t + " e ON e.seq = d.event_seq" +
		" WHERE d.subscriber = ANY($1::text[]) AND d.poisoned_at IS NULL AND d.next_attempt_at <= now()" +
		" AND EXISTS (SELECT 1 FROM " + subscribers + " s WHERE s.name = d.subscriber AND s.retired_at IS NULL AND s.paused_at IS NULL)"
	s.ClaimOwed = "SELECT " + owedColumns + owed + " ORDER BY d.next_attempt_at, d.event_seq LIMIT $2 FOR UPDATE OF d, e SKIP LOCKED"
	s.ClaimOwedOne = "SELECT " + owedColumns + owed + " AND d.event_seq = $2 FOR UPDATE OF d, e SKIP LOCKED"
	// One query tells an idle relay both whether new rows wait (a
	// notification may have been throttled or lost) and when the next failed
	// event or owed pair of its subscribers $1 is due; each through a small
	// partial index.
	s.Poll = "SELECT EXISTS (SELECT 1 FROM " + t + " WHERE " + pending + " AND attempts = 0)," +
		" extract(epoch FROM least((SELECT min(next_attempt_at) FROM " + t + " WHERE " + pending + " AND attempts > 0)," +
		" (SELECT min(next_attempt_at) FROM " + deliveries + " WHERE subscriber = ANY($1::text[]) AND poisoned_at IS NULL" +
		" AND subscriber NOT IN (SELECT name FROM " + subscribers + " WHERE paused_at IS NOT NULL OR retired_at IS NOT NULL))) - now())"
	// The stamp. $3 is the subscribers the round served: every other active
	// registered subscriber whose types match an event (or whose types are
	// unknown: registered by an older release) is owed it, as a pair. The
	// registry rows read are locked FOR KEY SHARE, so a RetireSubscriber
	// (which locks its row FOR UPDATE) waits for this stamp, and a stamp
	// after it sees the subscriber retired: a retired name is never written
	// back. When the relay knows every registered subscriber, which is the
	// common path, no row is locked and no pair written.
	s.Stamp = "WITH lacking AS (SELECT name, types_regexp FROM " + subscribers +
		" WHERE retired_at IS NULL AND name <> ALL($3::text[]) FOR KEY SHARE)," +
		" stamped AS (UPDATE " + t + " AS e SET fanned_out_at = now(), fanout = u.fanout::jsonb, next_attempt_at = NULL" +
		" FROM unnest($1::bigint[], $2::text[]) AS u(seq, fanout) WHERE e.seq = u.seq RETURNING e.seq, e.type)" +
		" INSERT INTO " + deliveries + " (event_seq, subscriber)" +
		" SELECT st.seq, l.name FROM stamped st JOIN lacking l ON l.types_regexp IS NULL OR ('.' || st.type) ~ l.types_regexp" +
		" ON CONFLICT DO NOTHING"
	// The deliveries lane's stamp: the events' fanouts extended by the new
	// jobs ($1 seqs, $2 fanout documents) and the pairs served ($3 seqs, $4
	// subscribers) deleted, in the round's transaction.
	s.StampOwed = "WITH f AS (UPDATE " + t + " AS e SET fanout = coalesce(e.fanout, '{}') || u.fanout::jsonb" +
		" FROM unnest($1::bigint[], $2::text[]) AS u(seq, fanout) WHERE e.seq = u.seq)" +
		" DELETE FROM " + deliveries + " AS d USING unnest($3::bigint[], $4::text[]) AS p(seq, sub)" +
		" WHERE d.event_seq = p.seq AND d.subscriber = p.sub"
	// A failed attempt of pairs ($1 seqs, $2 subscribers, $3 errors, $4
	// pauses in µs, $5 MaxAttempts): the first one writes the owed pair, a
	// later one counts up; the last is poisoned. The error joins the pair's
	// history of its last 10. Pairs of a subscriber retired meanwhile are
	// not written (its registry row is read FOR KEY SHARE, as in Stamp).
	s.ChargeDeliveries = "WITH reg AS (SELECT name FROM " + subscribers +
		" WHERE name = ANY($2::text[]) AND retired_at IS NULL FOR KEY SHARE)," +
		" c AS (INSERT INTO " + deliveries + " AS d (event_seq, subscriber, attempts, next_attempt_at, poisoned_at, last_error, errors)" +
		" SELECT u.seq, u.sub, 1, now() + u.delay * interval '1 microsecond', CASE WHEN 1 >= $5 THEN now() END, u.err," +
		" jsonb_build_array(jsonb_build_object('at', now(), 'error', u.err))" +
		" FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[]) AS u(seq, sub, err, delay) JOIN reg ON reg.name = u.sub" +
		" ON CONFLICT (event_seq, subscriber) DO UPDATE SET attempts = d.attempts + 1, next_attempt_at = EXCLUDED.next_attempt_at," +
		" poisoned_at = CASE WHEN d.attempts + 1 >= $5 THEN now() END, last_error = EXCLUDED.last_error," +
		" errors = (SELECT jsonb_agg(x ORDER BY n) FROM (SELECT x, n FROM jsonb_array_elements(d.errors || EXCLUDED.errors)" +
		" WITH ORDINALITY AS a(x, n) ORDER BY n DESC LIMIT 10) h)" +
		" RETURNING event_seq, subscriber, poisoned_at IS NOT NULL AS poisoned)" +
		" SELECT c.event_seq, c.subscriber, c.poisoned, CASE WHEN c.poisoned THEN pg_notify(" + Literal(s.ChannelFanned) +
		", (SELECT id::text FROM " + t + " WHERE seq = c.event_seq)) END FROM c"
	s.Charge = charge(pending)
	s.Load = "SELECT " + claimColumns + pausedColumn + " FROM " + t + " WHERE seq = $1"
	s.ConvertCatchUp = "SELECT " + qualify(schema, "outbox_convert_catch_up") + "($1)"
	s.NotifyFanned = "SELECT pg_notify(" + Literal(s.ChannelFanned) + ", $1)"
	s.NotifyEvents = "SELECT " + notifyEvents

	// The registry. $1 names, $2 their type globs (comma-separated: a glob
	// has no comma), $3 the globs' regular expression.
	// Registering locks nothing that exists unless its types changed: an
	// INSERT … ON CONFLICT DO UPDATE would lock every existing row, and
	// FanOutTx registers inside the caller's transaction, where a lock on a
	// shared row would hold every other relay's Start until that commits.
	// last_served_at is the heartbeat's (it beats at once on Start).
	s.Register = `WITH u AS (SELECT name, string_to_array(types, ',') AS types, re
			FROM unnest($1::text[], $2::text[], $3::text[]) AS u(name, types, re)),
		ins AS (
			INSERT INTO ` + subscribers + ` (name, types, types_regexp, last_served_at)
			SELECT name, types, re, now() FROM u
			ON CONFLICT (name) DO NOTHING),
		upd AS (
			UPDATE ` + subscribers + ` AS s SET types = coalesce(u.types, s.types), types_regexp = coalesce(u.re, s.types_regexp)
			  FROM u
			 WHERE s.name = u.name AND s.retired_at IS NULL
			   AND (coalesce(u.types, s.types) IS DISTINCT FROM s.types OR coalesce(u.re, s.types_regexp) IS DISTINCT FROM s.types_regexp))
		SELECT name FROM ` + subscribers + ` WHERE name = ANY($1::text[]) AND retired_at IS NOT NULL ORDER BY name`
	// The row is locked FOR UPDATE first: that waits for every stamp that
	// read it (FOR KEY SHARE) and makes later ones see it retired.
	s.Retire = `WITH l AS (SELECT name FROM ` + subscribers + ` WHERE name = $1 FOR UPDATE),
		r AS (
			UPDATE ` + subscribers + ` AS s SET retired_at = coalesce(s.retired_at, now()), paused_at = NULL
			  FROM l WHERE s.name = l.name RETURNING s.name)
		SELECT EXISTS (SELECT 1 FROM r)`
	s.RetireDeliveries = `WITH d AS (
			DELETE FROM ` + deliveries + ` WHERE (event_seq, subscriber) IN (
				SELECT event_seq, subscriber FROM ` + deliveries + ` WHERE subscriber = $1 LIMIT $2)
			RETURNING 1)
		SELECT count(*) FROM d`
	s.RetireCatchUp = `WITH c AS (
			UPDATE ` + t + ` SET catch_up = nullif(array_remove(catch_up, $1), '{}')
			 WHERE seq IN (SELECT seq FROM ` + t + ` WHERE catch_up @> ARRAY[$1]::text[] AND catch_up IS NOT NULL LIMIT $2)
			RETURNING 1)
		SELECT count(*) FROM c`
	s.BackfillStart = `WITH reg AS (
			SELECT name, types_regexp IS NOT NULL AS typed,
				CASE WHEN backfill_since = $2 THEN coalesce(backfill_seq, 0) ELSE 0 END AS from_seq
			  FROM ` + subscribers + ` WHERE name = $1 AND retired_at IS NULL FOR UPDATE),
		start AS (
			UPDATE ` + subscribers + ` s SET backfill_since = $2, backfill_seq = reg.from_seq, backfill_done_at = NULL
			  FROM reg WHERE s.name = reg.name AND reg.typed)
		SELECT EXISTS (SELECT 1 FROM reg), coalesce((SELECT typed FROM reg), false), coalesce((SELECT from_seq FROM reg), 0),
			coalesce((SELECT max(seq) FROM ` + t + `), 0)`
	// The event rows are locked FOR KEY SHARE: a deliveries round or a
	// stamp holding one (FOR UPDATE) is waited for and the row re-read, so
	// a pair delivered meanwhile is seen in its fanout; retention skips the
	// rows held. The registry row is read FOR KEY SHARE, as by a stamp.
	s.BackfillBatch = `WITH reg AS (
			SELECT name, types_regexp FROM ` + subscribers + `
			 WHERE name = $1 AND retired_at IS NULL AND types_regexp IS NOT NULL FOR KEY SHARE),
		ev AS (
			SELECT e.seq FROM ` + t + ` e, reg
			 WHERE e.seq > $3 AND e.seq <= $4 AND e.created_at >= $2 AND e.fanned_out_at IS NOT NULL
			   AND ('.' || e.type) ~ reg.types_regexp AND NOT (coalesce(e.fanout, '{}') ? $1::text)
			   FOR KEY SHARE OF e),
		ins AS (
			INSERT INTO ` + deliveries + ` (event_seq, subscriber) SELECT seq, $1 FROM ev
			ON CONFLICT (event_seq, subscriber) DO NOTHING RETURNING 1),
		progress AS (
			UPDATE ` + subscribers + ` SET backfill_seq = $4 WHERE name = $1 AND backfill_since = $2)
		SELECT EXISTS (SELECT 1 FROM reg), (SELECT count(*) FROM ins), (SELECT ` + notifyEvents + `)`
	s.BackfillDone = "UPDATE " + subscribers + " SET backfill_done_at = now() WHERE name = $1 AND backfill_since = $2"
	s.Pause = "UPDATE " + subscribers + " SET paused_at = coalesce(paused_at, now()) WHERE name = $1 AND retired_at IS NULL RETURNING name"
	s.Resume = "WITH r AS (UPDATE " + subscribers + " SET paused_at = NULL WHERE name = $1 AND retired_at IS NULL RETURNING name)" +
		" SELECT name, " + notifyEvents + " FROM r"
	s.ListSubscribers = "SELECT name, registered_at, retired_at, coalesce(types, '{}') AS types, last_served_at, paused_at," +
		" backfill_since, coalesce(backfill_seq, 0) AS backfill_seq, backfill_done_at FROM " +
		subscribers + " ORDER BY name"
	// An unregistered name counts as retired: no relay can serve it.
	s.SubscriberRetired = "SELECT coalesce((SELECT retired_at IS NOT NULL FROM " + subscribers + " WHERE name = $1), true)"

	// Heartbeats: $1 relay id, $2 host, $3 pid, $4 version, $5 subscribers
	// served, $6 started, $7 listening, $8 poll only, $9 consecutive
	// failures, $10 last round, $11 OrphanAfter in µs. It also marks the
	// subscribers served, forgets relays not seen for a day, and returns the
	// orphaned subscribers: registered, active, served by no relay for
	// OrphanAfter.
	orphaned := func(after string) string {
		return "SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM " + subscribers +
			" WHERE retired_at IS NULL AND coalesce(last_served_at, registered_at) < now() - " + after + "::bigint * interval '1 microsecond'"
	}
	s.Heartbeat = `WITH hb AS (
			INSERT INTO ` + relays + ` AS r (id, host, pid, version, subscribers, started_at, last_seen_at, listening, poll_only, consecutive_failures, last_round_at)
			VALUES ($1, $2, $3, $4, $5::text[], $6, now(), $7, $8, $9, $10)
			ON CONFLICT (id) DO UPDATE SET last_seen_at = now(), subscribers = EXCLUDED.subscribers, listening = EXCLUDED.listening,
				consecutive_failures = EXCLUDED.consecutive_failures, last_round_at = EXCLUDED.last_round_at, stopped_at = NULL),
		served AS (UPDATE ` + subscribers + ` SET last_served_at = now() WHERE name = ANY($5::text[]) AND retired_at IS NULL),
		gone AS (DELETE FROM ` + relays + ` WHERE last_seen_at < now() - interval '1 day')
		` + orphaned("$11") + ` AND NOT (name = ANY($5::text[]))`
	s.RelayStopped = "UPDATE " + relays + " SET stopped_at = now(), last_seen_at = now(), listening = false WHERE id = $1"
	s.ListRelays = "SELECT id, host, pid, version, subscribers, started_at, last_seen_at, stopped_at, listening, poll_only," +
		" consecutive_failures, last_round_at FROM " + relays + " ORDER BY started_at, id"

	// Receipts and operators.
	// The pairs still owed at the time (subscriber -> null, or the last
	// error of a poisoned one) come with each receipt.
	s.Await = "SELECT id, fanned_out_at, fanout, poisoned_at IS NOT NULL, coalesce(last_error, '')," +
		" (SELECT jsonb_object_agg(d.subscriber, CASE WHEN d.poisoned_at IS NOT NULL THEN coalesce(d.last_error, '') END)" +
		" FROM " + deliveries + " d WHERE d.event_seq = " + t + ".seq) FROM " + t +
		" WHERE id = ANY($1::text[]::uuid[])"
	s.AwaitDone = "SELECT id::text FROM " + t + " WHERE id = ANY($1::text[]::uuid[])" +
		" AND (fanned_out_at IS NOT NULL OR poisoned_at IS NOT NULL)"
	const infoColumns = "seq, id, type, subject, scope, payload, created_at, fanned_out_at, fanout, attempts, last_error, next_attempt_at, poisoned_at"
	s.Inspect = "SELECT " + infoColumns + " FROM " + t + " WHERE id = $1"
	// Requeue of one event: the event itself if it is poisoned, and every
	// poisoned pair of it. Attempts start again; the pairs' error history
	// stays.
	s.Requeue = `WITH ev AS (SELECT seq FROM ` + t + ` WHERE id = $1),
		requeued AS (
			UPDATE ` + t + ` SET poisoned_at = NULL, attempts = 0, last_error = NULL, next_attempt_at = NULL
			 WHERE id = $1 AND poisoned_at IS NOT NULL
			RETURNING seq),
		pairs AS (
			UPDATE ` + deliveries + ` SET poisoned_at = NULL, attempts = 0, next_attempt_at = now()
			 WHERE event_seq IN (SELECT seq FROM ev) AND poisoned_at IS NOT NULL
			RETURNING event_seq)
		SELECT EXISTS (SELECT 1 FROM ev), EXISTS (SELECT 1 FROM requeued) OR EXISTS (SELECT 1 FROM pairs),
			(SELECT ` + notifyEvents + `)`
	// Discard of one event: its poisoned pairs are dropped; the row itself
	// is deleted only when the event was poisoned as a whole (never fanned
	// out, so no subscriber's fanout record lives on it).
	s.Discard = `WITH ev AS (SELECT seq FROM ` + t + ` WHERE id = $1),
		pairs AS (
			DELETE FROM ` + deliveries + ` WHERE event_seq IN (SELECT seq FROM ev) AND poisoned_at IS NOT NULL RETURNING event_seq),
		discarded AS (
			DELETE FROM ` + t + ` WHERE id = $1 AND poisoned_at IS NOT NULL AND fanned_out_at IS NULL RETURNING seq)
		SELECT EXISTS (SELECT 1 FROM ev), EXISTS (SELECT 1 FROM discarded) OR EXISTS (SELECT 1 FROM pairs)`

	// Pairs. A pair is named by its event's ID ($1) and its subscriber ($2).
	const deliveryColumns = "e.seq, e.id, e.type, e.subject, d.subscriber, d.attempts, d.last_error, d.errors, d.next_attempt_at, d.poisoned_at, d.created_at"
	s.DeliveriesOf = "SELECT " + deliveryColumns + " FROM " + deliveries + " d JOIN " + t + " e ON e.seq = d.event_seq" +
		" WHERE d.event_seq = $1 ORDER BY d.subscriber"
	// $1 limit, $2 'owed' or 'poisoned', $3 type regexp or NULL, $4
	// subscriber or NULL, $5 and $6 the cursor (seq, subscriber) or NULL.
	s.ListDeliveries = "SELECT " + deliveryColumns + " FROM " + deliveries + " d JOIN " + t + " e ON e.seq = d.event_seq" +
		" WHERE (d.poisoned_at IS NOT NULL) = ($2 = 'poisoned')" +
		" AND ($3::text IS NULL OR ('.' || e.type) ~ $3) AND ($4::text IS NULL OR d.subscriber = $4)" +
		" AND ($5::bigint IS NULL OR (d.event_seq, d.subscriber) > ($5, $6::text))" +
		" ORDER BY d.event_seq, d.subscriber LIMIT $1"
	s.RequeueDelivery = `WITH p AS (
			SELECT d.event_seq, d.poisoned_at FROM ` + deliveries + ` d JOIN ` + t + ` e ON e.seq = d.event_seq
			 WHERE e.id = $1 AND d.subscriber = $2),
		q AS (
			UPDATE ` + deliveries + ` SET poisoned_at = NULL, attempts = 0, next_attempt_at = now()
			 WHERE (event_seq, subscriber) IN (SELECT event_seq, $2 FROM p WHERE poisoned_at IS NOT NULL) RETURNING 1)
		SELECT EXISTS (SELECT 1 FROM p), EXISTS (SELECT 1 FROM q), (SELECT ` + notifyEvents + `)`
	s.DiscardDelivery = `WITH p AS (
			SELECT d.event_seq, d.poisoned_at FROM ` + deliveries + ` d JOIN ` + t + ` e ON e.seq = d.event_seq
			 WHERE e.id = $1 AND d.subscriber = $2),
		q AS (
			DELETE FROM ` + deliveries + `
			 WHERE (event_seq, subscriber) IN (SELECT event_seq, $2 FROM p WHERE poisoned_at IS NOT NULL) RETURNING 1)
		SELECT EXISTS (SELECT 1 FROM p), EXISTS (SELECT 1 FROM q)`
	// By filter, a batch at a time: $1 type regexp or NULL, $2 subscriber or
	// NULL, $3 batch size.
	pick := `SELECT d.event_seq, d.subscriber FROM ` + deliveries + ` d JOIN ` + t + ` e ON e.seq = d.event_seq
			 WHERE d.poisoned_at IS NOT NULL AND ($1::text IS NULL OR ('.' || e.type) ~ $1) AND ($2::text IS NULL OR d.subscriber = $2)
			 LIMIT $3 FOR UPDATE OF d SKIP LOCKED`
	s.RequeueDeliveries = `WITH q AS (
			UPDATE ` + deliveries + ` SET poisoned_at = NULL, attempts = 0, next_attempt_at = now()
			 WHERE (event_seq, subscriber) IN (` + pick + `) RETURNING 1)
		SELECT count(*), (SELECT ` + notifyEvents + `) FROM q`
	s.DiscardDeliveries = `WITH q AS (
			DELETE FROM ` + deliveries + ` WHERE (event_seq, subscriber) IN (` + pick + `) RETURNING 1)
		SELECT count(*) FROM q`
	// Each figure from a small partial index (the pending, retry, poisoned,
	// catch-up and fanned-out indexes), so it stays fast on a table of
	// millions of rows: outbox_stats (migration 004) counts with sequential
	// scans off, whatever the planner's statistics say.
	// $1 is OrphanAfter in µs.
	s.Stats = "SELECT s.pending, s.retrying, s.poisoned + d.poisoned_events, s.catching_up, s.fanned_last_minute, s.lag_seconds, d.owed, d.poisoned," +
		" (" + orphaned("$1") + "), (SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM " + subscribers +
		" WHERE paused_at IS NOT NULL AND retired_at IS NULL) FROM " +
		qualify(schema, "outbox_stats") + "() s, " + qualify(schema, "outbox_delivery_stats") + "() d"
	filters := ` AND ($2::text IS NULL OR ('.' || type) ~ $2) AND ($3::text IS NULL OR subject = $3)`
	list := func(where, cursor, order string) string {
		return "SELECT " + infoColumns + " FROM " + t + " WHERE " + where + filters +
			" AND ($4::bigint IS NULL OR " + cursor + ") ORDER BY " + order + " LIMIT $1"
	}
	s.List = map[string]string{
		// $5 is unused in seq order, but every list takes the same five.
		"pending":  list(pending+" AND attempts = 0", "(seq > $4 AND $5::timestamptz IS NOT NULL)", "seq"),
		"retrying": list(pending+" AND attempts > 0", "(seq > $4 AND $5::timestamptz IS NOT NULL)", "seq"),
		// Poisoned as a whole, or for some subscriber: such an event shows
		// its latest poisoned pair's time, attempts and error.
		"poisoned": "SELECT " + infoColumns + " FROM (" +
			"SELECT seq, id, type, subject, scope, payload, created_at, fanned_out_at, fanout, attempts, last_error, next_attempt_at, poisoned_at" +
			" FROM " + t + " WHERE poisoned_at IS NOT NULL" +
			" UNION ALL SELECT e.seq, e.id, e.type, e.subject, e.scope, e.payload, e.created_at, e.fanned_out_at, e.fanout," +
			" p.attempts, p.last_error, e.next_attempt_at, p.poisoned_at" +
			" FROM (SELECT DISTINCT ON (event_seq) event_seq, attempts, last_error, poisoned_at FROM " + deliveries +
			" WHERE poisoned_at IS NOT NULL ORDER BY event_seq, poisoned_at DESC) p JOIN " + t + " e ON e.seq = p.event_seq" +
			" WHERE e.poisoned_at IS NULL) x WHERE true" + filters +
			" AND ($4::bigint IS NULL OR (poisoned_at, seq) < ($5::timestamptz, $4)) ORDER BY poisoned_at DESC, seq DESC LIMIT $1",
		"recent": list("fanned_out_at IS NOT NULL AND poisoned_at IS NULL", "(fanned_out_at, seq) < ($5::timestamptz, $4)", "fanned_out_at DESC, seq DESC"),
	}
	s.Prune = `WITH doomed AS (
			SELECT seq FROM ` + t + `
			 WHERE fanned_out_at < now() - $1::bigint * interval '1 microsecond'
			   AND fanned_out_at IS NOT NULL AND poisoned_at IS NULL AND catch_up IS NULL
			   AND NOT EXISTS (SELECT 1 FROM ` + deliveries + ` d WHERE d.event_seq = ` + t + `.seq)
			 ORDER BY fanned_out_at LIMIT $2
			   FOR UPDATE SKIP LOCKED)
		DELETE FROM ` + t + ` WHERE seq IN (SELECT seq FROM doomed)`
	return s
}
