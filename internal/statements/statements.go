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

	// The relay's rounds.
	ClaimBatch, ClaimOne, ClaimDue string
	ClaimCatchUp, ClaimCatchUpOne  string
	Poll, Stamp, StampCatchUp      string
	Charge, ChargeCatchUp, Load    string
	NotifyFanned                   string
	// NotifyEvents wakes the relays, outside any host transaction (an
	// awaiter's kick).
	NotifyEvents string

	// The subscriber registry.
	Register, Retire, ListSubscribers, SubscriberRetired string

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

	// The relay.
	const claimColumns = "seq, id, type, subject, scope, payload, created_at, attempts, catch_up, trace_context"
	pending := "fanned_out_at IS NULL AND poisoned_at IS NULL"
	// Rows stamped by relays that lacked some registered subscriber; $1 is
	// the names this relay knows. Failed ones wait for next_attempt_at.
	catchUp := "catch_up IS NOT NULL AND catch_up && $1::text[] AND poisoned_at IS NULL"
	// charge records a failed attempt ($1 seq, $2 error, $3 pause in µs, $4
	// MaxAttempts) and poisons the row at the last one. A poisoning is
	// announced on the fanned channel too: receipts waiting for the event
	// must learn it will not be fanned out.
	charge := func(where string) string {
		return "WITH c AS (UPDATE " + t + " SET attempts = attempts + 1, last_error = $2, next_attempt_at = now() + $3::bigint * interval '1 microsecond'," +
			" poisoned_at = CASE WHEN attempts + 1 >= $4 THEN now() END" +
			" WHERE seq = $1 AND " + where + " RETURNING id, poisoned_at IS NOT NULL AS poisoned)" +
			" SELECT poisoned, CASE WHEN poisoned THEN pg_notify(" + Literal(s.ChannelFanned) + ", id::text) END FROM c"
	}
	// Never "seq > cursor": a row whose transaction commits late has a lower
	// seq than rows already fanned out, and must still be found. Rows that
	// failed before wait for their retry time in ClaimDue.
	s.ClaimBatch = "SELECT " + claimColumns + " FROM " + t + " WHERE " + pending +
		" AND attempts = 0 ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED"
	s.ClaimOne = "SELECT " + claimColumns + " FROM " + t + " WHERE " + pending + " AND seq = $1 FOR UPDATE SKIP LOCKED"
	s.ClaimDue = "SELECT " + claimColumns + " FROM " + t + " WHERE " + pending +
		" AND attempts > 0 AND next_attempt_at <= now() ORDER BY next_attempt_at, seq LIMIT $1 FOR UPDATE SKIP LOCKED"
	s.ClaimCatchUp = "SELECT " + claimColumns + " FROM " + t + " WHERE " + catchUp +
		" AND (next_attempt_at IS NULL OR next_attempt_at <= now()) ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED"
	s.ClaimCatchUpOne = "SELECT " + claimColumns + " FROM " + t + " WHERE " + catchUp + " AND seq = $2 FOR UPDATE SKIP LOCKED"
	// One query tells an idle relay both whether new rows wait (a
	// notification may have been throttled or lost) and when the next failed
	// one is due; both through small partial indexes.
	s.Poll = "SELECT EXISTS (SELECT 1 FROM " + t + " WHERE " + pending + " AND attempts = 0)," +
		" (SELECT extract(epoch FROM min(next_attempt_at) - now()) FROM " + t + " WHERE " + pending + " AND attempts > 0)"
	// $3 is the names of the subscribers the relay knows: every other active
	// subscriber in the registry is left to catch the rows up.
	s.Stamp = "WITH m AS (SELECT array_agg(name ORDER BY name) AS names FROM " + subscribers +
		" WHERE retired_at IS NULL AND name <> ALL($3::text[]))" +
		" UPDATE " + t + " AS e SET fanned_out_at = now(), fanout = u.fanout::jsonb, next_attempt_at = NULL, catch_up = m.names" +
		" FROM unnest($1::bigint[], $2::text[]) AS u(seq, fanout), m WHERE e.seq = u.seq"
	s.StampCatchUp = "UPDATE " + t + " AS e SET fanout = coalesce(e.fanout, '{}') || u.fanout::jsonb," +
		" catch_up = nullif(ARRAY(SELECT unnest(e.catch_up) EXCEPT SELECT unnest($3::text[])), '{}')," +
		" attempts = 0, last_error = NULL, next_attempt_at = NULL" +
		" FROM unnest($1::bigint[], $2::text[]) AS u(seq, fanout) WHERE e.seq = u.seq"
	s.Charge = charge(pending)
	s.ChargeCatchUp = charge("catch_up IS NOT NULL AND poisoned_at IS NULL")
	s.Load = "SELECT " + claimColumns + " FROM " + t + " WHERE seq = $1"
	s.NotifyFanned = "SELECT pg_notify(" + Literal(s.ChannelFanned) + ", $1)"
	s.NotifyEvents = "SELECT " + notifyEvents

	// The registry.
	s.Register = `WITH ins AS (
			INSERT INTO ` + subscribers + ` (name) SELECT unnest($1::text[]) ON CONFLICT (name) DO NOTHING)
		SELECT name FROM ` + subscribers + ` WHERE name = ANY($1::text[]) AND retired_at IS NOT NULL ORDER BY name`
	s.Retire = `WITH r AS (
			UPDATE ` + subscribers + ` SET retired_at = coalesce(retired_at, now())
			 WHERE name = $1 RETURNING name),
		c AS (
			UPDATE ` + t + ` SET catch_up = nullif(array_remove(catch_up, $1), '{}')
			 WHERE catch_up @> ARRAY[$1]::text[] AND EXISTS (SELECT 1 FROM r))
		SELECT EXISTS (SELECT 1 FROM r)`
	s.ListSubscribers = "SELECT name, registered_at, retired_at FROM " + subscribers + " ORDER BY name"
	// An unregistered name counts as retired: no relay can serve it.
	s.SubscriberRetired = "SELECT coalesce((SELECT retired_at IS NOT NULL FROM " + subscribers + " WHERE name = $1), true)"

	// Receipts and operators.
	s.Await = "SELECT id, fanned_out_at, fanout, poisoned_at IS NOT NULL, coalesce(last_error, '') FROM " + t +
		" WHERE id = ANY($1::text[]::uuid[])"
	s.AwaitDone = "SELECT id::text FROM " + t + " WHERE id = ANY($1::text[]::uuid[])" +
		" AND (fanned_out_at IS NOT NULL OR poisoned_at IS NOT NULL)"
	const infoColumns = "seq, id, type, subject, scope, payload, created_at, fanned_out_at, fanout, attempts, last_error, next_attempt_at, poisoned_at"
	s.Inspect = "SELECT " + infoColumns + " FROM " + t + " WHERE id = $1"
	s.Requeue = `WITH requeued AS (
			UPDATE ` + t + ` SET poisoned_at = NULL, attempts = 0, last_error = NULL, next_attempt_at = NULL
			 WHERE id = $1 AND poisoned_at IS NOT NULL
			RETURNING seq, ` + notifyEvents + `)
		SELECT EXISTS (SELECT 1 FROM ` + t + ` WHERE id = $1), EXISTS (SELECT 1 FROM requeued)`
	s.Discard = `WITH discarded AS (
			DELETE FROM ` + t + ` WHERE id = $1 AND poisoned_at IS NOT NULL RETURNING seq)
		SELECT EXISTS (SELECT 1 FROM ` + t + ` WHERE id = $1), EXISTS (SELECT 1 FROM discarded)`
	// Each figure from a small partial index (the pending, retry, poisoned,
	// catch-up and fanned-out indexes), so it stays fast on a table of
	// millions of rows: outbox_stats (migration 004) counts with sequential
	// scans off, whatever the planner's statistics say.
	s.Stats = "SELECT pending, retrying, poisoned, catching_up, fanned_last_minute, lag_seconds FROM " +
		qualify(schema, "outbox_stats") + "()"
	filters := ` AND ($2::text IS NULL OR ('.' || type) ~ $2) AND ($3::text IS NULL OR subject = $3)`
	list := func(where, cursor, order string) string {
		return "SELECT " + infoColumns + " FROM " + t + " WHERE " + where + filters +
			" AND ($4::bigint IS NULL OR " + cursor + ") ORDER BY " + order + " LIMIT $1"
	}
	s.List = map[string]string{
		// $5 is unused in seq order, but every list takes the same five.
		"pending":  list(pending+" AND attempts = 0", "(seq > $4 AND $5::timestamptz IS NOT NULL)", "seq"),
		"retrying": list(pending+" AND attempts > 0", "(seq > $4 AND $5::timestamptz IS NOT NULL)", "seq"),
		"poisoned": list("poisoned_at IS NOT NULL", "(poisoned_at, seq) < ($5::timestamptz, $4)", "poisoned_at DESC, seq DESC"),
		"recent":   list("fanned_out_at IS NOT NULL AND poisoned_at IS NULL", "(fanned_out_at, seq) < ($5::timestamptz, $4)", "fanned_out_at DESC, seq DESC"),
	}
	s.Prune = `WITH doomed AS (
			SELECT seq FROM ` + t + `
			 WHERE fanned_out_at < now() - $1::bigint * interval '1 microsecond'
			   AND fanned_out_at IS NOT NULL AND poisoned_at IS NULL AND catch_up IS NULL
			 ORDER BY fanned_out_at LIMIT $2
			   FOR UPDATE SKIP LOCKED)
		DELETE FROM ` + t + ` WHERE seq IN (SELECT seq FROM doomed)`
	return s
}
