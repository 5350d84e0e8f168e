package maintenance_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// slotAway is the ring's slot k periods after the present one.
func slotAway(t *testing.T, pool *pgxpool.Pool, k int) int {
	t.Helper()
	var s int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT (outbox_slot_of(now()) + $1) % 10", k).Scan(&s))
	return s
}

// truncations records the partitions a pruner emptied and the DELETEs it
// ran.
type truncations struct {
	mu      sync.Mutex
	emptied []string
	batches int
}

func (tr *truncations) watch(p *maintenance.Pruner) {
	p.OnTruncate = func(part string) {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		tr.emptied = append(tr.emptied, part)
	}
	p.OnBatch = func(int) {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		tr.batches++
	}
}

// A partition whose rows have all expired is emptied with one TRUNCATE, not
// deleted 5,000 rows at a time: what makes retention cost the same for a
// million rows as for ten, and leave no dead rows behind.
func TestPrunerEmptiesAnExpiredPartitionWhole(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	s := slotAway(t, pool, 5)
	old := insert(t, pool, 3*maintenance.PruneBatchMax, "slot, fanned_out_at", fmt.Sprintf("%d, now() - interval '2 hours'", s))
	p := pruner(pool, defaultSQL(t))
	var tr truncations
	tr.watch(p)
	p.Pass(context.Background(), nil)
	require.Zero(t, remaining(t, pool, old))
	require.Equal(t, []string{fmt.Sprintf("outbox_events_%d", s)}, tr.emptied)
	require.LessOrEqual(t, tr.batches, 1, "the rows went by DELETE (%d batches), not by TRUNCATE", tr.batches)
	var dead int64
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = $1", fmt.Sprintf("outbox_events_%d", s)).Scan(&dead))
	require.Zero(t, dead)
}

// A partition with a single row that has not expired is not emptied, and
// that row stays (its expired neighbours go by DELETE): pending, retrying,
// poisoned, recent, owing a pair or a 0.1.0 catch_up list.
func TestPrunerLeavesAPartitionWithAnyRowUnexpired(t *testing.T) {
	t.Parallel()
	for what, state := range map[string][2]string{
		"pending":     {"created_at", "now() - interval '2 hours'"},
		"retrying":    {"attempts, next_attempt_at, created_at", "1, now() + interval '1 hour', now() - interval '2 hours'"},
		"poisoned":    {"poisoned_at, attempts", "now() - interval '2 hours', 5"},
		"recent":      {"fanned_out_at", "now() - interval '59 minutes'"},
		"owing":       {"fanned_out_at", "now() - interval '2 hours'"},
		"catching up": {"fanned_out_at, catch_up", "now() - interval '2 hours', ARRAY['ghost']"},
	} {
		t.Run(what, func(t *testing.T) {
			t.Parallel()
			pool := testdb.New(t)
			s := slotAway(t, pool, 5)
			old := insert(t, pool, 100, "slot, fanned_out_at", fmt.Sprintf("%d, now() - interval '2 hours'", s))
			keep := insert(t, pool, 1, "slot, "+state[0], fmt.Sprintf("%d, %s", s, state[1]))
			if what == "owing" {
				_, err := pool.Exec(context.Background(), "INSERT INTO outbox_deliveries (event_seq, subscriber) VALUES ($1, 'late')", keep[0])
				require.NoError(t, err)
			}
			p := pruner(pool, defaultSQL(t))
			var tr truncations
			tr.watch(p)
			p.Pass(context.Background(), nil)
			require.Empty(t, tr.emptied, "a partition holding a %s row was emptied", what)
			require.Equal(t, 1, remaining(t, pool, keep), "the %s row is gone", what)
			require.Zero(t, remaining(t, pool, old), "the expired rows beside it stayed")
		})
	}
}

// The partitions of this period and the one before are never emptied, even
// when every row in them has expired: host transactions write to them, and
// must never wait for retention.
func TestPrunerNeverEmptiesThePartitionsHostsWriteTo(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	var old []int64
	for _, k := range []int{0, -1} {
		s := slotAway(t, pool, 10+k)
		old = append(old, insert(t, pool, 100, "slot, fanned_out_at", fmt.Sprintf("%d, now() - interval '2 hours'", s))...)
	}
	p := pruner(pool, defaultSQL(t))
	var tr truncations
	tr.watch(p)
	p.Pass(context.Background(), nil)
	require.Empty(t, tr.emptied)
	require.Zero(t, remaining(t, pool, old), "the DELETEs did not take the expired rows")
}

// A partition that a transaction still writes to (one that began periods
// ago and records now) is not emptied: the TRUNCATE waits for its lock at
// most a moment and gives up, the DELETEs take the expired rows, and the
// transaction's event, committed afterwards, is there.
func TestPrunerLeavesAPartitionAWriterHolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	s := slotAway(t, pool, 5)
	old := insert(t, pool, 100, "slot, fanned_out_at", fmt.Sprintf("%d, now() - interval '2 hours'", s))
	writer, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer writer.Rollback(ctx)
	var late int64
	require.NoError(t, writer.QueryRow(ctx, "INSERT INTO outbox_events (id, type, slot) VALUES (gen_random_uuid(), 'late', $1) RETURNING seq", s).Scan(&late))

	p := pruner(pool, defaultSQL(t))
	var tr truncations
	tr.watch(p)
	start := time.Now()
	p.Pass(ctx, nil)
	require.Less(t, time.Since(start), 20*time.Second, "the pass waited for the writer")
	require.Empty(t, tr.emptied)
	require.Zero(t, remaining(t, pool, old))
	require.NoError(t, writer.Commit(ctx))
	require.Equal(t, 1, remaining(t, pool, []int64{late}))
}

// Whether a partition has expired is asked again under the exclusive lock:
// a row committed between the list and the TRUNCATE keeps its partition.
func TestTruncateLooksAgainUnderTheLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	sql := defaultSQL(t)
	s := slotAway(t, pool, 5)
	insert(t, pool, 100, "slot, fanned_out_at", fmt.Sprintf("%d, now() - interval '2 hours'", s))
	rows, err := pool.Query(ctx, sql.ExpiredPartitions, time.Hour.Microseconds())
	require.NoError(t, err)
	parts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{fmt.Sprintf("outbox_events_%d", s)}, parts)
	late := insert(t, pool, 1, "slot", strconv.Itoa(s))
	var emptied bool
	require.NoError(t, pool.QueryRow(ctx, sql.TruncateExpired, parts[0], time.Hour.Microseconds()).Scan(&emptied))
	require.False(t, emptied)
	require.Equal(t, 1, remaining(t, pool, late))
}
