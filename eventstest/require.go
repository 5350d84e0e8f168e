package eventstest

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/standmeet/events"
)

// T is the part of testing.TB that the assertions use; *testing.T and
// *testing.B satisfy it.
type T interface {
	Helper()
	Fatalf(format string, args ...any)
}

// RequireOpts adjusts the assertions. Nil means the defaults.
type RequireOpts struct {
	// Outbox is the schema of the library's tables; the zero Outbox is the
	// search_path's.
	Outbox events.Outbox
}

// RequireRecordedTx asserts that tx's transaction has recorded (by
// events.Record, events.RecordMany, outbox_record or a watch trigger) an
// event like want, and returns it. want.Type must be set; want.Subject and
// want.Payload, when set, must match too (the payload as JSON: key order and
// spacing do not matter). Otherwise it fails t, listing what tx recorded.
func RequireRecordedTx(ctx context.Context, t T, tx pgx.Tx, want events.Event, opts *RequireOpts) events.Event {
	t.Helper()
	got := recorded(ctx, t, tx, opts)
	for _, e := range got {
		if matches(e, want) {
			return e
		}
	}
	t.Fatalf("eventstest: no event like %s was recorded in the transaction; it recorded %s", describe(want), describeAll(got))
	return events.Event{}
}

// RequireNotRecordedTx asserts that tx's transaction has recorded no event of
// type eventType. Otherwise it fails t, listing those it recorded.
func RequireNotRecordedTx(ctx context.Context, t T, tx pgx.Tx, eventType string, opts *RequireOpts) {
	t.Helper()
	var found []events.Event
	for _, e := range recorded(ctx, t, tx, opts) {
		if e.Type == eventType {
			found = append(found, e)
		}
	}
	if len(found) > 0 {
		t.Fatalf("eventstest: the transaction recorded %d event(s) of type %q: %s", len(found), eventType, describeAll(found))
	}
}

func recorded(ctx context.Context, t T, tx pgx.Tx, opts *RequireOpts) []events.Event {
	t.Helper()
	if opts == nil {
		opts = &RequireOpts{}
	}
	got, err := opts.Outbox.RecordedInTx(ctx, tx)
	if err != nil {
		t.Fatalf("eventstest: reading the transaction's events: %v", err)
	}
	return got
}

func matches(e, want events.Event) bool {
	if e.Type != want.Type || (want.Subject != "" && e.Subject != want.Subject) {
		return false
	}
	if len(want.Payload) == 0 {
		return true
	}
	var a, b any
	return json.Unmarshal(e.Payload, &a) == nil && json.Unmarshal(want.Payload, &b) == nil && reflect.DeepEqual(a, b)
}

func describe(e events.Event) string {
	s := e.Type
	if e.Subject != "" {
		s += " (" + e.Subject + ")"
	}
	if len(e.Payload) > 0 {
		s += " " + string(e.Payload)
	}
	return s
}

func describeAll(es []events.Event) string {
	if len(es) == 0 {
		return "nothing"
	}
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = describe(e)
	}
	return strings.Join(parts, ", ")
}

// FanoutTx fans out, inside tx, every event pending now (committed ones and
// those tx recorded itself) with relay's subscribers, inserting the jobs
// through client: see [events.Relay.FanoutTx]. It fails t on an error and
// returns how many events it claimed. The relay must not be started.
func FanoutTx(ctx context.Context, t T, tx pgx.Tx, relay *events.Relay, client *river.Client[pgx.Tx]) int {
	t.Helper()
	n, err := relay.FanoutTx(ctx, tx, client)
	if err != nil {
		t.Fatalf("eventstest: fan out: %v", err)
	}
	return n
}
