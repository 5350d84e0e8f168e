package events

import (
	"cmp"
	"context"
	"encoding/json"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/standmeet/events/internal/notifylimit"
)

// Event is a fact the host application recorded: something happened to a
// subject. It is what subscribers receive.
type Event struct {
	// ID identifies the event. [Record] assigns it (a UUIDv7); leave it zero.
	ID uuid.UUID `json:"id"`

	// Seq orders events by when they were inserted. It is assigned by the
	// database; commit order may differ, which is why the relay never treats
	// it as a cursor.
	Seq int64 `json:"seq"`

	// Type names what happened, as dot-separated segments of ASCII letters,
	// digits, '_' and '-', for example "corpus.note.changed". Subscribers
	// select events by type with glob patterns (see [Subscriber.Types]).
	// Required; at most [MaxTypeLength] bytes.
	Type string `json:"type"`

	// Subject names what it happened to, for example "note:42". Coalescing
	// subscribers keep one event per subject and batch. Optional (an event
	// with no subject is never coalesced); at most [MaxSubjectLength] bytes of
	// valid UTF-8.
	Subject string `json:"subject,omitempty"`

	// Scope says whose event it is, for example "tenant:42". Webhook
	// endpoints (package webhook) receive only the scopes they list.
	// Optional; at most [MaxScopeLength] bytes of valid UTF-8.
	Scope string `json:"scope,omitempty"`

	// Payload is a JSON document with the event's data. Empty means {}.
	// At most [MaxPayloadBytes] bytes.
	Payload json.RawMessage `json:"payload"`

	// CreatedAt is when the event was inserted (the database's now() of the
	// recording transaction).
	CreatedAt time.Time `json:"created_at"`
}

// Limits enforced by [Record] and [RecordMany].
const (
	MaxTypeLength    = 255
	MaxSubjectLength = 255
	MaxScopeLength   = 255
	MaxPayloadBytes  = 1 << 20 // 1 MiB
)

// Outbox is the library's handle: its tables in one schema, and the
// settings every part of it shares. Every component is built from one —
// [RelayConfig.Outbox], [AwaiterConfig.Outbox], and the webhook and web view
// packages' configs — and every operator operation is one of its methods
// ([Outbox.Migrate], [Outbox.GetStats], [Outbox.Requeue], …), so the schema is
// said once. The zero Outbox is the tables on the connection's search_path,
// as River's zero Schema is; [Record] and [RecordMany] write there, and
// [Outbox.Record] to another schema. An Outbox is a small value, safe to copy
// and to use from many goroutines; its statements are built once per schema
// and shared.
type Outbox struct {
	// Schema holds the library's tables and River's: the schema
	// [Outbox.Migrate] creates them in, and the River client's
	// (river.Config.Schema). Empty means the connection's search_path. At
	// most 46 letters, digits and underscores: River's client refuses a
	// longer schema.
	Schema string

	// NotifyInterval throttles the notification that wakes the relays:
	// [Record] and [RecordMany] send it in at most one transaction per
	// NotifyInterval per process and schema. A transaction that notifies
	// takes PostgreSQL's cluster-wide notify lock at commit and holds it
	// through its WAL flush, so notifying in every transaction serialises
	// every writer's commit; relays do not depend on the notification (they
	// re-check shortly after each wake-up and poll when idle). Defaults to
	// NotifyIntervalDefault (2 ms); NotifyEveryTransaction notifies in
	// every transaction; a negative value never notifies.
	NotifyInterval time.Duration

	// OrphanAfter is how long a registered, active subscriber may go
	// unserved by every running relay before [Outbox.GetStats] reports it
	// orphaned: by [Relay.Health], by a warning log naming the fix (deploy
	// it, or [Outbox.RetireSubscriber]), and by [Outbox.GetStats]. Its owed
	// deliveries keep their events from retention until then and after. Defaults
	// to OrphanAfterDefault (15 min).
	OrphanAfter time.Duration
}

func (o Outbox) withDefaults() Outbox {
	o.OrphanAfter = cmp.Or(o.OrphanAfter, OrphanAfterDefault)
	return o
}

// Validate reports whether o can be used, as every component built from it
// checks: an error wrapping [ErrInvalidConfig] that names the field (as a
// config's Outbox field). Other packages building on the library (webhook,
// eventsui) call it.
func (o Outbox) Validate() error {
	if _, err := statementsFor(o.Schema); err != nil {
		return err
	}
	if o.OrphanAfter < 0 {
		return invalidf(ErrInvalidConfig, "Outbox.OrphanAfter", "%v: must not be negative", o.OrphanAfter)
	}
	return nil
}

// Notification throttling of [Outbox.NotifyInterval].
const (
	NotifyIntervalDefault  = 2 * time.Millisecond
	NotifyEveryTransaction = time.Duration(1) // shorter than any transaction
	NotifyNever            = time.Duration(-1)
)

// notify reports whether the calling transaction should send the relays'
// notification.
func (o Outbox) notify() bool {
	interval := cmp.Or(o.NotifyInterval, NotifyIntervalDefault)
	if interval == NotifyEveryTransaction {
		return true
	}
	return notifylimit.For(o.Schema).Allow(interval)
}

// DB is what the read and requeue functions need: a *pgxpool.Pool, a
// *pgx.Conn or a pgx.Tx.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
