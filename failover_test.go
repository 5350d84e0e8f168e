package events

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

// A primary fails over to its synchronous standby mid-drain, after an outage
// of 5 s and of 40 s: the pool connects with a multi-host connection string
// and target_session_attrs=read-write, so it finds the new primary by
// itself. Every event whose commit returned success is fanned out exactly
// once; the first event recorded after the promotion is fanned out within
// 2 s of its commit, however long the outage was (a relay's backoff ends as
// soon as the database answers); receipts resume.
func TestPrimaryFailover(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("fails a primary over twice, with a 40 s outage: run without -short (CI does)")
	}
	for _, outage := range []time.Duration{5 * time.Second, 40 * time.Second} {
		t.Run(fmt.Sprint(outage, " outage"), func(t *testing.T) {
			t.Parallel()
			failover(t, outage)
		})
	}
}

func failover(t *testing.T, outage time.Duration) {
	ctx := context.Background()
	// Durable: with synchronous_commit off a commit returns before the
	// standby has it, and a failover loses it (see the README).
	primary := testdb.NewDurableCluster(t)
	standby, err := primary.Standby(ctx)
	require.NoError(t, err)
	t.Cleanup(standby.Close)
	dbURL := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/events?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		primary.Port(), standby.Port())

	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	relay, err := NewRelay(pool, &RelayConfig{Logger: quietLogger()})
	require.NoError(t, err)
	require.NoError(t, relay.Subscribe(mapSub("audit", false, "**")))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quietLogger()})
	require.NoError(t, err)
	require.NoError(t, relay.Start(ctx, client))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		require.NoError(t, relay.Stop(stopCtx))
	})
	awaiter, err := NewAwaiter(pool, &AwaiterConfig{Logger: quietLogger()})
	require.NoError(t, err)
	require.NoError(t, awaiter.Start(ctx))
	t.Cleanup(func() { require.NoError(t, awaiter.Stop(ctx)) })
	requireClosed(t, relay.Ready(), "relay ready")

	// Writers record without pause; a commit that returned success is
	// logged, with when it returned.
	type commit struct {
		id uuid.UUID
		at time.Time
	}
	var (
		mu        sync.Mutex
		committed []commit
		stop      = make(chan struct{})
		wg        sync.WaitGroup
		failures  atomic.Int64
	)
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				var e Event
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var err error
					e, err = Record(ctx, tx, Event{Type: "account.changed", Subject: "account:1"})
					return err
				})
				if err != nil {
					failures.Add(1)
					time.Sleep(20 * time.Millisecond) // a writer's own retry pause while the database is away
					continue
				}
				mu.Lock()
				committed = append(committed, commit{e.ID, time.Now()})
				mu.Unlock()
			}
		})
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(committed) }
	require.Eventually(t, func() bool { return count() >= 1000 }, 60*time.Second, time.Millisecond)

	primary.Crash()
	crashedAt := time.Now()
	time.Sleep(outage) // the outage itself: nothing to wait for but time
	require.NoError(t, standby.Promote(ctx))
	promotedAt := time.Now()
	t.Logf("primary crashed after %d commits; standby promoted %v later", count(), promotedAt.Sub(crashedAt))

	// The first event whose commit returned after the promotion.
	var first commit
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range committed {
			if c.at.After(promotedAt) {
				first = c
				return true
			}
		}
		return false
	}, 30*time.Second, time.Millisecond, "no writer committed after the promotion")
	t.Logf("first commit %v after the promotion", first.at.Sub(promotedAt))
	var fannedAt time.Time
	require.Eventually(t, func() bool {
		err := pool.QueryRow(ctx, "SELECT fanned_out_at FROM outbox_events WHERE id = $1 AND fanned_out_at IS NOT NULL", first.id).Scan(&fannedAt)
		return err == nil
	}, 30*time.Second, 5*time.Millisecond)
	waited := time.Since(first.at)
	t.Logf("first event after the promotion fanned out within %v of its commit", waited)
	require.Less(t, waited, 2*time.Second, "the relay waited out its backoff after the database was back")

	// Receipts resume.
	receipts, err := awaiter.AwaitFanout(within(t, 10*time.Second), first.id)
	require.NoError(t, err)
	require.Contains(t, receipts[0].Fanout, "audit")

	require.Eventually(t, func() bool { return count() >= 2000 }, 60*time.Second, time.Millisecond)
	close(stop)
	wg.Wait()

	// Exactly once, for every commit that returned success.
	waitFannedOut(t, pool, 60*time.Second)
	jobs := map[string]int{}
	rows, err := pool.Query(ctx, "SELECT args->>'event_id' FROM river_job")
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		jobs[id]++
	}
	require.NoError(t, rows.Err())
	mu.Lock()
	defer mu.Unlock()
	for _, c := range committed {
		require.Equal(t, 1, jobs[c.id.String()], "event %s committed but has %d jobs", c.id, jobs[c.id.String()])
	}
	for id, n := range jobs {
		require.Equal(t, 1, n, "event %s has %d jobs", id, n)
	}
	t.Logf("%d events committed, each fanned out once; %d writer attempts failed during the outage", len(committed), failures.Load())
}
