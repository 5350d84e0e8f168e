package engine_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/engine"
	"github.com/standmeet/events/internal/glob"
	"github.com/standmeet/events/internal/statements"
	"github.com/standmeet/events/internal/testdb"
)

type seqArgs struct {
	Seq int64 `json:"seq"`
}

func (seqArgs) Kind() string { return "engine_test" }

// config is an engine config with no-op instruments, as a relay without
// a MeterProvider has.
func config(t *testing.T) engine.Config {
	t.Helper()
	m := metricnoop.NewMeterProvider().Meter("test")
	var ms engine.Metrics
	var err error
	for _, c := range []*metric.Int64Counter{&ms.Jobs, &ms.Fanned, &ms.Coalesced, &ms.Failures, &ms.Poisoned, &ms.Reconnects} {
		*c, err = m.Int64Counter("c")
		require.NoError(t, err)
	}
	ms.RoundDuration, err = m.Float64Histogram("h")
	require.NoError(t, err)
	ms.BatchSize, err = m.Int64Histogram("b")
	require.NoError(t, err)
	return engine.Config{
		BatchSize: 3, MaxAttempts: 3, RetryBackoff: time.Second, MaxRetryBackoff: time.Minute, MaxRoundsInFlight: 1,
		PollInterval: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Metrics: ms, Tracer: tracenoop.NewTracerProvider().Tracer("test"),
	}
}

// subscription is an engine Subscription of name for the types globs,
// whose Job maps an event to seqArgs (nil args for a subscription that
// skips).
func subscription(t *testing.T, name string, coalesce, skip bool, types ...string) *engine.Subscription {
	t.Helper()
	s := engine.Subscription{Name: name, Coalesce: coalesce, Job: func(_ context.Context, e engine.Event) (engine.Mapped, error) {
		if skip {
			return engine.Mapped{}, nil
		}
		return engine.Mapped{Args: seqArgs{e.Seq}, Kind: seqArgs{}.Kind()}, nil
	}}
	for _, ty := range types {
		p, err := glob.Compile(ty)
		require.NoError(t, err)
		s.Patterns = append(s.Patterns, p)
	}
	return engine.NewSubscription(s)
}

// The engine alone, on a real database: FanoutIn runs rounds inside the
// caller's transaction until a batch comes back short. Each event goes to
// each Subscription it matches once, a coalescing one's events of a subject
// share the latest event's job, a Job that returns no args gets no job,
// every event is stamped with its fanout, and a second call finds nothing.
func TestFanoutInServesEachMatchingSubscriptionOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	sql, err := statements.For("")
	require.NoError(t, err)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	require.NoError(t, err)

	recorded := record(t, pool,
		events.Event{Type: "note.changed", Subject: "note:1"},
		events.Event{Type: "note.changed", Subject: "note:2"},
		events.Event{Type: "note.renamed", Subject: "note:1"},
		events.Event{Type: "user.created", Subject: "user:1"},
		events.Event{Type: "note.changed"},
	)
	subs := []*engine.Subscription{
		subscription(t, "search", true, false, "note.*"),
		subscription(t, "audit", false, false, "**"),
		subscription(t, "quiet", false, true, "note.*"),
	}
	r := engine.New(pool, sql, config(t))
	fanout := func() int {
		t.Helper()
		var n int
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			n, err = r.FanoutIn(ctx, tx, config(t), client, subs)
			return err
		}))
		return n
	}
	require.Equal(t, len(recorded), fanout(), "batches of 3: the rounds go on until one comes back short")
	require.Zero(t, fanout(), "fanned out twice")

	// seq -> subscriber -> job ID, and job ID -> the seq its args carry.
	stamped := map[int64]map[string]int64{}
	rows, err := pool.Query(ctx, "SELECT seq, fanout FROM outbox_events WHERE fanned_out_at IS NOT NULL")
	require.NoError(t, err)
	for rows.Next() {
		var (
			seq int64
			doc []byte
			f   map[string]int64
		)
		require.NoError(t, rows.Scan(&seq, &doc))
		require.NoError(t, json.Unmarshal(doc, &f))
		stamped[seq] = f
	}
	require.NoError(t, rows.Err())
	carried := map[int64]int64{}
	jobs, err := pool.Query(ctx, "SELECT id, (args->>'seq')::bigint, tags FROM river_job")
	require.NoError(t, err)
	tagged := map[string]int{}
	for jobs.Next() {
		var (
			id, seq int64
			tags    []string
		)
		require.NoError(t, jobs.Scan(&id, &seq, &tags))
		carried[id] = seq
		for _, tag := range tags {
			tagged[tag]++
		}
	}
	require.NoError(t, jobs.Err())

	require.Len(t, stamped, len(recorded), "every event stamped")
	note1, note2, renamed, user, bare := recorded[0].Seq, recorded[1].Seq, recorded[2].Seq, recorded[3].Seq, recorded[4].Seq
	for _, e := range recorded {
		f := stamped[e.Seq]
		require.Equal(t, e.Seq, carried[f["audit"]], "audit's job for %d carries another event", e.Seq)
		require.NotContains(t, f, "quiet", "a Job with no args got a job")
	}
	require.NotContains(t, stamped[user], "search", "search took a type it does not match")
	// The first round claims note:1's two events: search's one job for
	// both carries the later.
	require.Equal(t, stamped[note1]["search"], stamped[renamed]["search"], "note:1's events of one round were not coalesced")
	require.Equal(t, renamed, carried[stamped[renamed]["search"]], "the coalesced job carries the earlier event")
	require.Equal(t, note2, carried[stamped[note2]["search"]])
	require.Equal(t, bare, carried[stamped[bare]["search"]], "an event without a subject is coalesced")
	require.Equal(t, map[string]int{"events-subscriber-audit": 5, "events-subscriber-search": 3}, tagged)
}

// record commits events in one transaction and returns them with their
// seqs.
func record(t *testing.T, pool *pgxpool.Pool, es ...events.Event) []events.Event {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	out, err := events.RecordMany(ctx, tx, es)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return out
}
