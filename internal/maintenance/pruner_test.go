package maintenance_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/maintenance"
	"github.com/standmeet/events/internal/statements"
	"github.com/standmeet/events/internal/testdb"
)

func TestMain(m *testing.M) {
	code := testdb.Main(m, func(ctx context.Context, pool *pgxpool.Pool) error {
		return events.Outbox{}.Migrate(ctx, pool)
	})
	if code == 0 {
		if err := goleak.Find(); err != nil {
			code = 1
		}
	}
	os.Exit(code)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func defaultSQL(t *testing.T) *statements.Set {
	t.Helper()
	s, err := statements.For("")
	require.NoError(t, err)
	return s
}

// insert adds n events in the state set names (columns = values), and
// returns their seqs.
func insert(t *testing.T, pool *pgxpool.Pool, n int, set, values string) []int64 {
	t.Helper()
	var seqs []int64
	require.NoError(t, pool.QueryRow(context.Background(), `WITH ins AS (
		INSERT INTO outbox_events (id, type, fanout, `+set+`)
		SELECT gen_random_uuid(), 'aged', '{}', `+values+` FROM generate_series(1, $1) RETURNING seq)
		SELECT array_agg(seq) FROM ins`, n).Scan(&seqs))
	return seqs
}

func remaining(t *testing.T, pool *pgxpool.Pool, seqs []int64) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox_events WHERE seq = ANY($1)", seqs).Scan(&n))
	return n
}

func pruner(pool *pgxpool.Pool, sql *statements.Set) *maintenance.Pruner {
	return &maintenance.Pruner{DB: pool, SQL: sql, Retention: time.Hour, Interval: time.Hour, Logger: quiet}
}

// One pass deletes every fanned-out event older than the retention that
// owes nothing, in batches of at most PruneBatchMax, and nothing else:
// pending, retrying, poisoned, recent, owing a pair or a 0.1.0 catch_up
// list.
func TestPrunerDeletesOnlyOldFannedOutEventsThatOweNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	old := insert(t, pool, 12_000, "fanned_out_at", "now() - interval '2 hours'")
	keep := map[string][]int64{
		"poisoned":    insert(t, pool, 3, "poisoned_at, attempts", "now() - interval '2 hours', 5"),
		"catching up": insert(t, pool, 3, "fanned_out_at, catch_up", "now() - interval '2 hours', ARRAY['ghost']"),
		"retrying":    insert(t, pool, 3, "attempts, next_attempt_at, created_at", "1, now() + interval '1 hour', now() - interval '2 hours'"),
		"pending":     insert(t, pool, 3, "created_at", "now() - interval '2 hours'"),
		"recent":      insert(t, pool, 3, "fanned_out_at", "now() - interval '59 minutes'"),
		"owing":       insert(t, pool, 3, "fanned_out_at", "now() - interval '2 hours'"),
	}
	_, err := pool.Exec(ctx, "INSERT INTO outbox_deliveries (event_seq, subscriber) SELECT unnest($1::bigint[]), 'late'", keep["owing"])
	require.NoError(t, err)

	var (
		mu    sync.Mutex
		sizes []int
	)
	p := pruner(pool, defaultSQL(t))
	p.OnBatch = func(size int) {
		mu.Lock()
		defer mu.Unlock()
		sizes = append(sizes, size)
	}
	p.Pass(ctx, nil)

	require.Zero(t, remaining(t, pool, old), "old fanned-out events are still there after a pass")
	for what, seqs := range keep {
		require.Equal(t, len(seqs), remaining(t, pool, seqs), "the pass deleted %s events", what)
	}
	require.GreaterOrEqual(t, len(sizes), 3, "12,000 rows take at least three batches")
	for _, s := range sizes {
		require.LessOrEqual(t, s, maintenance.PruneBatchMax)
	}
}

// A negative Retention keeps everything: passes run and delete nothing.
func TestPrunerWithNegativeRetentionKeepsEverything(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	old := insert(t, pool, 10, "fanned_out_at", "now() - interval '2 hours'")
	p := pruner(pool, defaultSQL(t))
	p.Retention = -1
	var passes, batches atomic.Int32
	p.OnPass = func() { passes.Add(1) }
	p.OnBatch = func(int) { batches.Add(1) }
	p.Pass(context.Background(), nil)
	require.EqualValues(t, 1, passes.Load())
	require.Zero(t, batches.Load(), "a pass deleted with Retention negative")
	require.Equal(t, 10, remaining(t, pool, old))
}

// Two relays' pruners on one database never delete at the same time: the
// advisory lock lets one batch run, and the other skips its pass.
func TestTwoPrunersNeverDeleteAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	first, second := testdb.Pool(t, url), testdb.Pool(t, url)
	old := insert(t, first, 20_000, "fanned_out_at", "now() - interval '2 hours'")
	var inside, most, batches atomic.Int32
	hook := func(int) {
		n := inside.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		batches.Add(1)
		time.Sleep(5 * time.Millisecond) // hold the lock a while: give the other a chance to collide
		inside.Add(-1)
	}
	stopping := make(chan struct{})
	var wg sync.WaitGroup
	for _, pool := range []*pgxpool.Pool{first, second} {
		p := pruner(pool, defaultSQL(t))
		p.Interval, p.OnBatch = 5*time.Millisecond, hook
		wg.Go(func() { p.Run(ctx, stopping) })
	}
	defer wg.Wait()
	defer close(stopping)
	require.Eventually(t, func() bool { return remaining(t, first, old) == 0 }, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, int32(1), most.Load(), "two pruners deleted at once")
	require.GreaterOrEqual(t, batches.Load(), int32(4))
}

// While the relay drains a backlog, retention deletes one batch a second:
// fan-out comes first, and the table still does not grow without bound.
func TestPrunerDeletesABatchASecondWhileTheRelayIsBusy(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	old := insert(t, pool, 3*maintenance.PruneBatchMax, "fanned_out_at", "now() - interval '2 hours'")
	p := pruner(pool, defaultSQL(t))
	p.Busy = func() bool { return true }
	var (
		mu sync.Mutex
		at []time.Time
	)
	p.OnBatch = func(int) {
		mu.Lock()
		defer mu.Unlock()
		at = append(at, time.Now())
	}
	p.Pass(context.Background(), nil)
	require.Zero(t, remaining(t, pool, old), "a busy relay's pass still deletes everything old")
	require.GreaterOrEqual(t, len(at), 3)
	for i := 1; i < len(at); i++ {
		// A timer's lower bound: a slow machine only widens the gaps.
		require.GreaterOrEqual(t, at[i].Sub(at[i-1]), 900*time.Millisecond, "batch %d came %v after the one before", i, at[i].Sub(at[i-1]))
	}
}

// A pass ends when the relay stops, between batches, and Run with it.
func TestPrunerStopsBetweenBatches(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	old := insert(t, pool, 3*maintenance.PruneBatchMax, "fanned_out_at", "now() - interval '2 hours'")
	p := pruner(pool, defaultSQL(t))
	p.Busy = func() bool { return true } // a second between batches
	p.Interval = 10 * time.Millisecond
	stopping := make(chan struct{})
	var batches atomic.Int32
	p.OnBatch = func(int) {
		if batches.Add(1) == 1 {
			close(stopping)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Run(context.Background(), stopping)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not end after stopping closed")
	}
	require.EqualValues(t, 1, batches.Load(), "a batch ran after stopping closed")
	require.Equal(t, 2*maintenance.PruneBatchMax, remaining(t, pool, old))
}
