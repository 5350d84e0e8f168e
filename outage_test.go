package events

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/listener"
	"github.com/standmeet/events/internal/testdb"
)

// listenerPID returns the backend of the relay's listening connection.
func listenerPID(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var pid int
	require.Eventually(t, func() bool {
		err := pool.QueryRow(context.Background(),
			"SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()",
			listener.ApplicationName).Scan(&pid)
		return err == nil
	}, 10*time.Second, 5*time.Millisecond, "no listener connection")
	return pid
}

// Events recorded while the listener is down are fanned out as soon as it is
// back, with no sweep configured: the relay looks after every reconnect,
// because notifications sent while it was away are gone.
func TestListenerReconnectsAndCatchesUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	var recordWhileDown sync.Once
	recorded := make(chan Event, 1)
	b.relay.hooks.reconnectPause = func(ctx context.Context, d time.Duration) {
		// The old connection is gone and the new one not yet made: a
		// notification sent now reaches no one.
		recordWhileDown.Do(func() { recorded <- b.record(t, Event{Type: "while.down"})[0] })
	}
	b.start(t)
	b.settle(t)
	old := listenerPID(t, b.pool)
	_, err := b.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", old)
	require.NoError(t, err)

	var e Event
	select {
	case e = <-recorded:
	case <-time.After(10 * time.Second):
		t.Fatal("the listener never reconnected")
	}
	require.Eventually(t, func() bool { return loadRows(t, b.pool)[e.ID].FannedOut }, 10*time.Second, 5*time.Millisecond)
	require.NotEqual(t, old, listenerPID(t, b.pool), "a new listening connection")

	// And the new connection carries notifications again.
	b.waitIdle(t)
	e = b.record(t, Event{Type: "after.reconnect"})[0]
	require.Eventually(t, func() bool { return loadRows(t, b.pool)[e.ID].FannedOut }, 5*time.Second, 5*time.Millisecond)
}

// PostgreSQL restarts while events are pending and relays are mid-round: no
// event is charged or poisoned, none is lost, none is fanned out twice, and
// the relays recover without a restart of their own.
func TestDatabaseRestartLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster := testdb.NewCluster(t)
	cfg := &RelayConfig{RetryBackoff: 20 * time.Millisecond, MaxRetryBackoff: 200 * time.Millisecond,
		Listener: ListenerConfig{ReconnectBackoff: 20 * time.Millisecond, MaxReconnectBackoff: 200 * time.Millisecond}, MaxAttempts: 1}
	subs := []Subscriber{mapSub("audit", false, "**"), mapSub("search", true, "**")}
	relays := []*testBundle{setup(t, setupOpts{url: cluster.URL, config: cfg}, subs...), setup(t, setupOpts{url: cluster.URL, config: cfg}, subs...)}

	// The first relay to reach the middle of a round holds it there while the
	// server goes down underneath.
	midRound, serverDown := make(chan struct{}), make(chan struct{})
	var once sync.Once
	for _, b := range relays {
		b.relay.hooks.afterInsert = func(context.Context, pgx.Tx) {
			once.Do(func() {
				close(midRound)
				<-serverDown
			})
		}
	}
	es := make([]Event, 600)
	for i := range es {
		es[i] = Event{Type: "note.changed", Subject: fmt.Sprintf("n%d", i%50)}
	}
	relays[0].record(t, es...)
	for _, b := range relays {
		b.start(t)
	}
	<-midRound
	cluster.Stop()
	close(serverDown)
	require.NoError(t, cluster.Start(ctx))

	// More events after the restart, through the reconnected listeners.
	more := make([]Event, 100)
	for i := range more {
		more[i] = Event{Type: "note.changed", Subject: fmt.Sprintf("m%d", i)}
	}
	require.Eventually(t, func() bool {
		err := pgx.BeginFunc(ctx, relays[1].pool, func(tx pgx.Tx) error {
			_, err := RecordMany(ctx, tx, more)
			return err
		})
		return err == nil
	}, 20*time.Second, 20*time.Millisecond)

	waitFannedOut(t, relays[0].pool, 60*time.Second)
	rows := loadRows(t, relays[0].pool)
	jobs := loadJobs(t, relays[0].pool)
	require.Len(t, rows, 700)
	audit := map[string]int{}
	for _, j := range jobs {
		if j.Subscriber == "audit" {
			audit[j.EventID.String()]++
		}
	}
	for _, r := range rows {
		require.True(t, r.FannedOut, "lost: %s", r.ID)
		require.False(t, r.Poisoned, "an outage poisoned %s", r.ID)
		require.Zero(t, r.Attempts, "an outage was charged to %s", r.ID)
		require.Equal(t, 1, audit[r.ID.String()], "audit jobs for %s", r.ID)
		for _, id := range r.Fanout {
			require.Contains(t, jobs, id)
		}
	}
}

// A single-row retry whose connection dies mid-round is the database's
// failure, not the row's: it is not charged.
func TestConnectionLossInARetryIsNotCharged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var calls atomic.Int32
	sub := Subscriber{Name: "flaky", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			if calls.Add(1) == 1 {
				return nil, nil, errors.New("first attempt fails")
			}
			return testArgs{EventID: e.ID}, nil, nil
		}}
	b := setup(t, setupOpts{config: &RelayConfig{RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 10 * time.Millisecond, MaxAttempts: 2}}, sub)
	admin := testdb.Pool(t, b.url)
	var killed atomic.Bool
	b.relay.hooks.afterInsert = func(ctx context.Context, tx pgx.Tx) {
		if calls.Load() == 2 && killed.CompareAndSwap(false, true) {
			var pid int
			require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
			_, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
			require.NoError(t, err)
		}
	}
	var charged atomic.Int32
	b.relay.hooks.charged = func(int64, int, time.Duration) { charged.Add(1) }
	e := b.record(t, Event{Type: "a"})[0]
	b.start(t)
	waitDelivered(t, b.pool, 20*time.Second)
	require.True(t, killed.Load())
	info, err := outbox.Inspect(ctx, b.pool, e.ID)
	require.NoError(t, err)
	require.Empty(t, info.Deliveries, "poisoned by a lost connection")
	require.EqualValues(t, 1, charged.Load(), "only the mapping failure counts")
	require.Len(t, info.Fanout, 1)
}
