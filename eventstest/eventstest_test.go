package eventstest_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/eventstest"
)

func TestMain(m *testing.M) { os.Exit(eventstest.Main(m)) }

// fakeT records a failure instead of failing the test, so the assertions'
// own failures can be checked.
type fakeT struct{ failed string }

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	panic(f) // stop like runtime.Goexit would, without ending the real test
}

func (f *fakeT) run(fn func()) {
	defer func() {
		if p := recover(); p != nil && p != f {
			panic(p)
		}
	}()
	fn()
}

func TestRequireRecordedTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := eventstest.Pool(t)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = events.Record(ctx, tx, events.Event{Type: "note.changed", Subject: "note:1", Payload: []byte(`{"a":1,"b":[2]}`)})
	require.NoError(t, err)

	got := eventstest.RequireRecordedTx(ctx, t, tx, events.Event{Type: "note.changed"}, nil)
	require.Equal(t, "note:1", got.Subject)
	eventstest.RequireRecordedTx(ctx, t, tx, events.Event{Type: "note.changed", Subject: "note:1", Payload: []byte(`{"b": [2], "a": 1}`)}, nil)
	eventstest.RequireNotRecordedTx(ctx, t, tx, "note.deleted", nil)

	for _, want := range []events.Event{
		{Type: "note.deleted"},
		{Type: "note.changed", Subject: "note:2"},
		{Type: "note.changed", Payload: []byte(`{"a":2}`)},
	} {
		f := &fakeT{}
		f.run(func() { eventstest.RequireRecordedTx(ctx, f, tx, want, nil) })
		require.Contains(t, f.failed, "no event like "+want.Type)
		require.Contains(t, f.failed, `note.changed (note:1) {"a": 1, "b": [2]}`, "the message lists what was recorded")
	}
	f := &fakeT{}
	f.run(func() { eventstest.RequireNotRecordedTx(ctx, f, tx, "note.changed", nil) })
	require.Contains(t, f.failed, `recorded 1 event(s) of type "note.changed"`)
}

type noteArgs struct {
	Subject string `json:"subject"`
}

func (noteArgs) Kind() string { return "note.index" }

// FanoutTx turns what a transaction recorded into jobs in that same
// transaction: no goroutine, no LISTEN, nothing left after a rollback.
func TestFanoutTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := eventstest.Pool(t)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	require.NoError(t, err)
	relay, err := events.NewRelay(pool, nil)
	require.NoError(t, err)
	require.NoError(t, relay.Subscribe(events.Subscriber{Name: "index", Types: []string{"note.*"},
		Map: func(_ context.Context, e events.Event) (river.JobArgs, *river.InsertOpts, error) {
			return noteArgs{Subject: e.Subject}, nil, nil
		}}))

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	recorded, err := events.RecordMany(ctx, tx, []events.Event{{Type: "note.changed", Subject: "note:1"}, {Type: "other"}})
	require.NoError(t, err)
	require.Equal(t, 2, eventstest.FanoutTx(ctx, t, tx, relay, client))
	var outbox events.Outbox // the tables on the search_path
	info, err := outbox.GetEvent(ctx, tx, recorded[0].ID)
	require.NoError(t, err)
	require.Len(t, info.Fanout, 1)
	var kind string
	require.NoError(t, tx.QueryRow(ctx, "SELECT kind FROM river_job WHERE id = $1", info.Fanout["index"]).Scan(&kind))
	require.Equal(t, "note.index", kind)
	require.Equal(t, 0, eventstest.FanoutTx(ctx, t, tx, relay, client), "nothing is left")
	require.NoError(t, tx.Rollback(ctx))

	var jobs int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM river_job").Scan(&jobs))
	require.Zero(t, jobs)
}
