package events

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

// A named schema whose name needs quoting (upper case) works like a
// lower-case one: every statement, the channels, the watch triggers.
func TestReview20MixedCaseSchemaEndToEnd(t *testing.T) {
	t.Parallel()
	exerciseAll(t, testdb.Pool(t, testdb.EmptyURL(t)), "Billing_EU", ListenerConfig{PollInterval: time.Hour})
}

// The Outbox accepts exactly the schema names a River client accepts: one
// Migrate creates but no River client can use (River keeps 63 bytes for
// "<schema>.<its longest channel>") is refused up front, not after the
// schema is created.
func TestOutboxSchemaLengthIsRiversLimit(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t, testdb.URL(t))
	for _, n := range []int{46, 47, 63} {
		schema := "s" + strings.Repeat("x", n-1)
		_, riverErr := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: schema, Logger: quietLogger()})
		err := Outbox{Schema: schema}.Validate()
		if riverErr != nil {
			require.ErrorIs(t, err, ErrInvalidConfig, "%d bytes: River refuses it (%v), the Outbox must too", n, riverErr)
		} else {
			require.NoError(t, err, "%d bytes", n)
		}
	}
	// A schema at River's limit works end to end, its channels hashed.
	exerciseAll(t, testdb.Pool(t, testdb.EmptyURL(t)), "S"+strings.Repeat("x", 45), ListenerConfig{PollInterval: time.Hour})
}

// Stop is bounded by its context also while Start is still preparing the
// run (registering the subscribers waits on a lock here, as it would on a
// slow or unreachable database): a shutdown's Stop returns by its deadline
// instead of waiting for Start, and the Start it interrupted begins no run.
func TestStopDuringAStartBlockedOnRegistration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	locker, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer locker.Rollback(ctx)
	_, err = locker.Exec(ctx, "LOCK TABLE outbox_subscribers IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	started := make(chan error, 1)
	go func() { started <- b.relay.Start(ctx, b.client) }()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'").Scan(&n))
		return n > 0
	}, 10*time.Second, 5*time.Millisecond, "Start never waited on the registry")

	stopCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- b.relay.Stop(stopCtx) }()
	select {
	case <-stopped:
	case <-time.After(3 * time.Second):
		_ = locker.Rollback(ctx)
		<-stopped
		<-started
		t.Fatal("Stop waited for a blocked Start past its context's deadline")
	}
	select {
	case err := <-started:
		require.Error(t, err, "the Start that Stop interrupted must not begin a run")
	case <-time.After(3 * time.Second):
		t.Fatal("the interrupted Start is still blocked")
	}
	require.NoError(t, locker.Rollback(ctx))
	// The relay starts again afterwards.
	b.start(t)
	requireClosed(t, b.relay.Ready(), "relay ready after the interrupted Start")
}

// A process's River client works Handle jobs (left from an earlier run, say)
// while its relay's Start waits on the registry: the worker's lookup of the
// subscriber must not wait for Start.
func TestHandleJobsRunWhileTheRelayStartWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	handled := make(chan struct{}, 1)
	b := setup(t, setupOpts{work: true}, Subscriber{Name: "mail", Types: []string{"**"}, Handle: func(context.Context, Event) error {
		handled <- struct{}{}
		return nil
	}})
	locker, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer locker.Rollback(ctx)
	_, err = locker.Exec(ctx, "LOCK TABLE outbox_subscribers IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	startCtx, cancelStart := context.WithCancel(ctx)
	defer cancelStart()
	started := make(chan error, 1)
	go func() { started <- b.relay.Start(startCtx, b.client) }()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'").Scan(&n))
		return n > 0
	}, 10*time.Second, 5*time.Millisecond, "Start never waited on the registry")

	_, err = b.client.Insert(ctx, HandleArgs{Subscriber: "mail", Event: Event{Type: "a"}}, nil)
	require.NoError(t, err)
	select {
	case <-handled:
	case <-time.After(5 * time.Second):
		t.Error("the Handle job waited for the relay's Start")
	}
	cancelStart()
	require.Error(t, <-started)
}

// A process that registers its Handle subscribers both on its relay and with
// Outbox.AddWorkers, into the same river.Workers, is told what to do: River
// takes one worker per kind, so the second set would never be looked up.
func TestAddWorkersTwiceSaysWhy(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, Subscriber{Name: "mail", Types: []string{"**"}, Handle: func(context.Context, Event) error { return nil }})
	workers := river.NewWorkers()
	require.NoError(t, b.relay.AddWorkers(workers))
	err := outbox.AddWorkers(workers, b.pool, Subscriber{Name: "ledger", Types: []string{"**"}, Handle: func(context.Context, Event) error { return nil }})
	require.Error(t, err)
	require.Contains(t, err.Error(), `"events.handle"`)
	require.Contains(t, err.Error(), "Relay.AddWorkers")
	require.Contains(t, err.Error(), "Outbox.AddWorkers")
}

// A worker-only process whose Outbox names another schema than its River
// client (nothing checks them against each other there: no relay) must not
// take a job of a subscriber it does not know for retired — the registry it
// would read is not the one the job's relay wrote — and cancel it for good
// during a rolling deploy. The job fails, saying why, and is retried.
func TestAWorkerOfAnotherSchemaThanItsClientCancelsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.URL(t)) // the search_path's outbox is migrated too
	billing := Outbox{Schema: "billing"}
	require.NoError(t, billing.Migrate(ctx, pool))
	// The relay's process, in billing, registers "mail".
	relay, err := NewRelay(pool, &RelayConfig{Outbox: billing, Logger: quietLogger()})
	require.NoError(t, err)
	require.NoError(t, relay.Subscribe(Subscriber{Name: "mail", Types: []string{"**"}, Handle: func(context.Context, Event) error { return nil }}))
	inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: "billing", Logger: quietLogger()})
	require.NoError(t, err)
	require.NoError(t, relay.Start(ctx, inserter))
	require.NoError(t, relay.Stop(ctx))

	// The worker's process: an older release that does not know "mail", its
	// Outbox left at the zero value while its River client works billing.
	workers := river.NewWorkers()
	require.NoError(t, Outbox{}.AddWorkers(workers, pool))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: "billing", Logger: quietLogger(), Workers: workers,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}}, FetchPollInterval: 50 * time.Millisecond, FetchCooldown: 10 * time.Millisecond})
	require.NoError(t, err)
	res, err := inserter.Insert(ctx, HandleArgs{Subscriber: "mail", Event: Event{Type: "a"}}, nil)
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() { require.NoError(t, client.Stop(context.WithoutCancel(ctx))) })

	var state string
	require.Eventually(t, func() bool {
		var attempted bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT state::text, attempted_at IS NOT NULL FROM billing.river_job WHERE id = $1", res.Job.ID).Scan(&state, &attempted))
		return attempted && state != "running"
	}, 10*time.Second, 10*time.Millisecond)
	require.NotEqual(t, "cancelled", state, "the job of a live subscriber was cancelled for good")
	var errs []byte
	require.NoError(t, pool.QueryRow(ctx, "SELECT coalesce(errors::text, '') FROM billing.river_job WHERE id = $1", res.Job.ID).Scan(&errs))
	require.Contains(t, string(errs), "schema", "the failure names the mismatch")
}
