// Package statements is the library's one query layer: every SQL statement
// the library runs, named, in the embedded .sql files of this package (one
// per area: record.sql, fanout.sql, deliveries.sql, …, webhook.sql), and
// built once per schema into a [Set]. It is the one place where table names
// meet SQL: Record, the relay, the awaiter, the operator functions, watches,
// Migrate and package webhook all take their statements from a Set. Only
// what a statement must name per call (a watch's trigger DDL: the host's
// table, columns and arguments; the schema Migrate creates) is filled in by
// the caller, quoted, through [Render].
//
// A file holds queries in sqlc's form: a "-- name: ClaimBatch" line starts
// each, and each [Set] field is filled with the query of its name (a test
// and the package's initialisation fail on a field without a query or a
// query without a field). The schema is substituted one way, River's: every
// table and function of the library and River is written
// /* TEMPLATE: schema */outbox_events, replaced by the schema-qualified,
// quoted name (or the bare name for the search_path) when the schema's Set
// is built; the channels are TEMPLATE_BEGIN … TEMPLATE_END spans holding the
// default schema's literal. The files are valid SQL as they stand.
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

// Set is the statements of one schema. Every field is read-only. A string
// field holds the query of its name; fields tagged sql:"-" are not queries.
type Set struct {
	Schema string `sql:"-"`
	// ChannelEvents and ChannelFanned are the schema's channels.
	ChannelEvents, ChannelFanned string `sql:"-"`
	// WatchFunction is the trigger function of watches, qualified.
	WatchFunction string `sql:"-"`

	// Recording (record.sql): with the relays' notification, and without
	// (the transaction's notification was throttled).
	Record, RecordNotify, RecordMany, RecordManyNotify, RecordedInTx string

	// The relay's rounds (fanout.sql, deliveries.sql): the pending lane
	// (events not yet fanned out) and the deliveries lane (owed pairs of
	// subscribers the relay knows).
	ClaimBatch, ClaimFrom, PendingBelow, ClaimOne, ClaimDue string
	ClaimOwed, ClaimOwedOne                                 string
	Poll, Stamp, StampOwed, NewestJobs                      string
	Charge, ChargeDeliveries, Load                          string
	ConvertCatchUp                                          string
	NotifyFanned                                            string
	// NotifyEvents wakes the relays, outside any host transaction (an
	// awaiter's kick).
	NotifyEvents string

	// The subscriber registry (registry.sql). RetireDeliveries and
	// RetireCatchUp delete, in batches of $2, what is still owed to the
	// retired subscriber $1.
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
	Heartbeat, RelayStopped, ClaimFloors, ListRelays string

	// Per-pair operator statements (deliveries.sql).
	DeliveriesOf, ListDeliveries         string
	RequeueDeliveries, DiscardDeliveries string

	// Receipts and operators (admin.sql).
	Await, AwaitDone, Inspect, Requeue    string
	Discard, RequeueEvents, DiscardEvents string
	Stats                                 string

	// The operator's view (opsview.sql).
	FanoutJobs, FanoutByMinute, DeliveriesBySubscriber string

	// Retention (retention.sql): Prune deletes up to $2 fanned-out rows
	// older than $1 µs, under PruneLock; ExpiredPartitions lists the
	// partitions whose rows have all expired, which TruncateExpired
	// empties.
	Prune, PruneLock                   string
	ExpiredPartitions, TruncateExpired string

	// List pages through events by state (list.sql), by state name:
	// "pending", "retrying", "poisoned", "recent". Every query takes $1
	// limit, $2 type regexp (see glob.Pattern.Regexp) or NULL, $3 subject or
	// NULL, $4 and $5 the cursor (seq, and the ordering time where the order
	// has one) or NULL.
	List                                                map[string]string `sql:"-"`
	ListPending, ListRetrying, ListPoisoned, ListRecent string

	// Watches (watch.sql). CreateWatchTrigger, CommentWatchTrigger,
	// DropWatchTrigger, CreateWatchFunction and DropWatchFunction keep
	// call-time templates for the identifiers they
	// name: see [Render].
	ResolveTable, TableColumns, WatchTriggers, WatchSchema, ListWatches string
	LockWatch                                                           string
	CreateWatchTrigger, CommentWatchTrigger, DropWatchTrigger           string
	CreateWatchFunction, DropWatchFunction                              string

	// Migrate's bookkeeping (migrate.sql). CreateSchema keeps a call-time
	// template: the schema's quoted name.
	MigrateLock, CreateSchema, CreateMigrationTable, MigrationVersions string
	MigrationApplied, RelationExists, SetChannel, IndexState           string

	// SetLocal ($1 setting, $2 value) sets a setting for the rest of the
	// transaction; RoundSettings and Commit open and end a relay round's own
	// transaction, each queued with the round's other statements
	// (session.sql).
	SetLocal, Setting, RoundSettings, Commit string

	// Webhook is package webhook's (webhook.sql).
	Webhook Webhook

	// Ordered is the chains of ordered subscribers' (ordered.sql).
	Ordered Ordered
}

// Webhook is the statements of package webhook.
type Webhook struct {
	CreateEndpoint, UpdateEndpoint, GetEndpoint, GetEndpointForDelivery, ListEndpoints string
	MatchingEndpoints, LockSecretHeaders, LockSecrets, SetSecrets                      string
	DisableEndpoint, EnableEndpoint, DeleteEndpoint, CancelPending                     string
	EndpointSucceeded, EndpointFailed, FailingFor, ResealCandidates, Reseal            string
	CreateHealth, Admit, BreakerState, BreakerClose, BreakerFail, Health               string
	InsertAttempt, ListAttempts, PruneAttempts, FailedEvents                           string
}

// base is every query as the files hold it, templates and all: checked
// against the Set once, when the package is initialised.
var base = func() *Set {
	queries, err := parse(files)
	if err == nil {
		s := new(Set)
		if err = fill(s, queries); err == nil {
			return s
		}
	}
	panic("statements: the .sql files and the Set disagree:\n" + err.Error())
}()

var (
	schemaRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
	cache    sync.Map // schema -> *Set
)

// MaxSchemaLength is the longest schema name: River's client refuses a
// longer one (it keeps "<schema>.<its longest channel>" within PostgreSQL's
// 63 bytes), so a longer schema could be migrated but never worked.
const MaxSchemaLength = 46

// ErrSchema is the reason For refuses a schema name.
var ErrSchema = fmt.Errorf("must be at most %d letters, digits and underscores (River's limit), starting with a letter or underscore", MaxSchemaLength)

// For returns the statements of schema ("" for the search_path), built on
// first use and shared afterwards.
func For(schema string) (*Set, error) {
	if s, ok := cache.Load(schema); ok {
		return s.(*Set), nil
	}
	if schema != "" && (len(schema) > MaxSchemaLength || !schemaRE.MatchString(schema)) {
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

// build renders the schema's Set from base.
func build(schema string) *Set {
	s := *base
	s.Schema = schema
	s.ChannelEvents = Channel(schema, ChannelEvents)
	s.ChannelFanned = Channel(schema, ChannelFanned)
	s.WatchFunction = qualify(schema, "outbox_watch")
	renderAll(&s, func(name string) string { return qualify(schema, name) }, map[string]string{
		"channel_events": Literal(s.ChannelEvents),
		"channel_fanned": Literal(s.ChannelFanned),
	})
	s.List = map[string]string{
		"pending":  s.ListPending,
		"retrying": s.ListRetrying,
		"poisoned": s.ListPoisoned,
		"recent":   s.ListRecent,
	}
	return &s
}
