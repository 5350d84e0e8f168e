package groupbatch

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/standmeet/events/internal/testdb"
)

func TestMain(m *testing.M) {
	code := testdb.Main(m, nil)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "leaked goroutines:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// result is what one item's statement returned.
type result struct {
	v    int
	txid int64
	seq  int64 // the order in which the server ran it
	err  error
}

// setup returns a pool on a new database with a sequence that numbers the
// statements as the server runs them, and a table to write to.
func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testdb.Pool(t, testdb.URL(t))
	_, err := pool.Exec(context.Background(), "CREATE SEQUENCE ran; CREATE TABLE t (v int PRIMARY KEY)")
	require.NoError(t, err)
	return pool
}

// item returns an item that returns v, its transaction and its turn, after
// sleeping sleep seconds, and where its result goes.
func item(key string, v int, sleep float64) (*Item, *result) {
	r := &result{}
	return &Item{Key: key, SQL: "SELECT $1::int, txid_current(), nextval('ran'), pg_sleep($2)::text",
			Args: []any{v, sleep},
			Scan: func(rows pgx.Rows) error {
				for rows.Next() {
					if err := rows.Scan(&r.v, &r.txid, &r.seq, nil); err != nil {
						return err
					}
				}
				return nil
			}},
		r
}

// doAll has n callers call Do at once, behind a first caller whose
// statement takes a while (so that the others queue), and returns the
// results, the first's at index 0.
func doAll(t *testing.T, b *Batcher, n int, key func(i int) string) []*result {
	t.Helper()
	ctx := context.Background()
	first, r0 := item(key(0), 0, 0.3)
	results := []*result{r0}
	var wg sync.WaitGroup
	wg.Go(func() { r0.err = b.Do(ctx, first) })
	require.Eventually(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.inFlight > 0 }, 30*time.Second, time.Millisecond)
	for i := 1; i < n; i++ {
		it, r := item(key(i), i, 0)
		results = append(results, r)
		wg.Go(func() { r.err = b.Do(ctx, it) })
	}
	wg.Wait()
	for i, r := range results {
		require.NoError(t, r.err, "item %d", i)
		require.Equal(t, i, r.v, "item %d got another's result", i)
	}
	return results
}

// Callers that arrive while a batch is in flight share the next one: one
// transaction (and so one round trip) for many statements, each caller
// getting its own statement's rows.
func TestCallersWhileABatchIsInFlightShareTheNext(t *testing.T) {
	t.Parallel()
	b := New(setup(t), 100, 1, time.Minute)
	results := doAll(t, b, 40, func(int) string { return "" })
	txs := map[int64]int{}
	for _, r := range results {
		txs[r.txid]++
	}
	// The first alone; the 39 that queued behind it in one or two batches
	// (one may have led before the last arrived).
	require.LessOrEqual(t, len(txs), 3, "transactions: %v", txs)
}

// A batch holds at most max items.
func TestABatchHoldsAtMostMax(t *testing.T) {
	t.Parallel()
	b := New(setup(t), 4, 1, time.Minute)
	results := doAll(t, b, 21, func(int) string { return "" })
	txs := map[int64]int{}
	for _, r := range results {
		txs[r.txid]++
	}
	for tx, n := range txs {
		require.LessOrEqual(t, n, 4, "transaction %d ran %d items", tx, n)
	}
	require.GreaterOrEqual(t, len(txs), 6) // 1 + ceil(20/4)
}

// Within a batch the statements run in their keys' order, whatever order
// their callers came in: writers of the same rows lock them in one order.
func TestABatchRunsInKeyOrder(t *testing.T) {
	t.Parallel()
	b := New(setup(t), 100, 1, time.Minute)
	n := 30
	results := doAll(t, b, n, func(i int) string { return fmt.Sprintf("k%02d", n-i) }) // reverse order of arrival
	byTx := map[int64][]*result{}
	for _, r := range results[1:] {
		byTx[r.txid] = append(byTx[r.txid], r)
	}
	for _, rs := range byTx {
		for i := 1; i < len(rs); i++ {
			// results arrived in ascending v, so keys descend: the server
			// must have run the later callers first.
			require.Greater(t, rs[i-1].seq, rs[i].seq, "items %d and %d ran out of key order", rs[i-1].v, rs[i].v)
		}
	}
	require.Less(t, len(byTx), n-1, "nothing was batched")
}

// A statement that fails rolls its batch back; every item then runs alone,
// so the others' writes happen once and only the bad one fails.
func TestAFailedBatchRunsItsItemsAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	b := New(pool, 100, 1, time.Minute)
	first, r0 := item("", 0, 0.3)
	var wg sync.WaitGroup
	wg.Go(func() { r0.err = b.Do(ctx, first) })
	require.Eventually(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.inFlight > 0 }, 30*time.Second, time.Millisecond)
	errs := make([]error, 10)
	for i := range errs {
		sql := "INSERT INTO t VALUES ($1) RETURNING v"
		if i == 5 {
			sql = "SELECT 1 / ($1::int - $1::int)" // division by zero
		}
		it := &Item{SQL: sql, Args: []any{i}, Scan: func(rows pgx.Rows) error {
			for rows.Next() {
			}
			return nil
		}}
		wg.Go(func() { errs[i] = b.Do(ctx, it) })
	}
	wg.Wait()
	require.NoError(t, r0.err)
	for i, err := range errs {
		if i == 5 {
			require.ErrorContains(t, err, "division by zero")
			continue
		}
		require.NoError(t, err, "item %d", i)
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n))
	require.Equal(t, 9, n)
}

// Do runs the item even when its caller's context has ended: the caller
// may need the outcome of work it already did (a completion).
func TestDoRunsAfterTheCallersContextEnded(t *testing.T) {
	t.Parallel()
	b := New(setup(t), 100, 1, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	it, r := item("", 7, 0)
	require.NoError(t, b.Do(ctx, it))
	require.Equal(t, 7, r.v)
}

// Many callers at once, in several lanes: every caller gets its own rows,
// no more batches are in flight than there are lanes, and none waits for
// ever when a lane is handed over.
func TestLanesBoundTheBatchesInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := New(setup(t), 3, 2, time.Minute)
	var mu sync.Mutex
	var now, most int
	b.sending = func(delta int) { mu.Lock(); now += delta; most = max(most, now); mu.Unlock() }
	var wg sync.WaitGroup
	results := make([]*result, 300)
	for i := range results {
		it, r := item("", i, 0.001)
		results[i] = r
		wg.Go(func() { r.err = b.Do(ctx, it) })
	}
	wg.Wait()
	txs := map[int64]int{}
	for i, r := range results {
		require.NoError(t, r.err, "item %d", i)
		require.Equal(t, i, r.v, "item %d got another's result", i)
		txs[r.txid]++
	}
	for tx, n := range txs {
		require.LessOrEqual(t, n, 3, "transaction %d ran %d items", tx, n)
	}
	require.LessOrEqual(t, most, 2, "batches in flight at once")
	require.Equal(t, 0, b.inFlight)
	require.Empty(t, b.queue)
}

// gate holds PostgreSQL advisory lock key on a connection of its own until
// the returned func opens it; a statement "SELECT pg_advisory_xact_lock(key)"
// waits for that.
func gate(t *testing.T, pool *pgxpool.Pool, key int64) (open func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key)
	require.NoError(t, err)
	var once sync.Once
	open = func() {
		once.Do(func() {
			_, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", key)
			conn.Release()
			require.NoError(t, err)
		})
	}
	t.Cleanup(open)
	return open
}

// queued reports how many callers wait for the next batch.
func queued(b *Batcher) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

func drain(rows pgx.Rows) error {
	for rows.Next() {
	}
	return nil
}

// A Scan that fails is a client-side error: the server ran the statement,
// and nothing tells it the batch failed. pgx's BatchResults.Close drains
// the pipeline, so the batch's transaction commits at its Sync; running
// every item again alone then runs each statement twice (a completion twice:
// the second run is refused as superseded, and the jobs the first run took
// are left running with no worker). The batch must be rolled back before
// its items run alone (or a Scan error must fail only its own item).
func TestAScanErrorDoesNotRunTheBatchTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	_, err := pool.Exec(ctx, "CREATE TABLE hits (v int)")
	require.NoError(t, err)
	b := New(pool, 100, 1, time.Minute)
	open := gate(t, pool, 42)
	var wg sync.WaitGroup
	var leadErr error
	wg.Go(func() { leadErr = b.Do(ctx, &Item{SQL: "SELECT pg_advisory_xact_lock(42)::text", Scan: drain}) })
	require.Eventually(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.inFlight > 0 }, 30*time.Second, time.Millisecond)
	errs := make([]error, 10)
	for i := range errs {
		it := &Item{Key: fmt.Sprintf("k%02d", i), SQL: "INSERT INTO hits VALUES ($1) RETURNING v", Args: []any{i}, Scan: drain}
		if i == 5 {
			it = &Item{Key: "k05", SQL: "SELECT 'not a number'", Scan: func(rows pgx.Rows) error {
				for rows.Next() {
					var n int
					if err := rows.Scan(&n); err != nil {
						return err
					}
				}
				return nil
			}}
		}
		wg.Go(func() { errs[i] = b.Do(ctx, it) })
	}
	require.Eventually(t, func() bool { return queued(b) == len(errs) }, 30*time.Second, time.Millisecond)
	open()
	wg.Wait()
	require.NoError(t, leadErr)
	for i, err := range errs {
		if i == 5 {
			require.Error(t, err)
			continue
		}
		require.NoError(t, err, "item %d", i)
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM hits").Scan(&n))
	require.Equal(t, 9, n, "the batch committed despite the failed Scan, and its items then ran again alone")
}

// An item that waits on a row lock (a relay's stamp holding a chain, another
// process's batch) holds up its whole batch until the batch's timeout; the
// timeout then fails every item of the batch, and none runs alone
// (retryAlone: "they would fail the same way"). They would not: the other
// items have nothing to do with that lock. Each failed completion is a
// handler that already ran and now runs again, for every worker whose
// statement happened to share the batch.
func TestAnItemWaitingOnALockDoesNotFailTheOthersInItsBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	_, err := pool.Exec(ctx, "INSERT INTO t VALUES (1)")
	require.NoError(t, err)
	locker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = locker.Rollback(ctx) }()
	_, err = locker.Exec(ctx, "SELECT v FROM t WHERE v = 1 FOR UPDATE")
	require.NoError(t, err)

	b := New(pool, 100, 1, 3*time.Second)
	open := gate(t, pool, 43)
	var wg sync.WaitGroup
	var leadErr, slowErr error
	wg.Go(func() { leadErr = b.Do(ctx, &Item{SQL: "SELECT pg_advisory_xact_lock(43)::text", Scan: drain}) })
	require.Eventually(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.inFlight > 0 }, 30*time.Second, time.Millisecond)
	slow := &Item{Key: "a", SQL: "SELECT v FROM t WHERE v = 1 FOR UPDATE", Scan: drain}
	other, r := item("b", 7, 0)
	wg.Go(func() { slowErr = b.Do(ctx, slow) })
	wg.Go(func() { r.err = b.Do(ctx, other) })
	require.Eventually(t, func() bool { return queued(b) == 2 }, 30*time.Second, time.Millisecond)
	open()
	wg.Wait()
	require.NoError(t, leadErr)
	require.Error(t, slowErr, "it waited on the lock past the batch's timeout")
	require.NoError(t, r.err, "an item failed because another item of its batch waited on a lock")
	require.Equal(t, 7, r.v)
}

// A Scan (any caller's: the leader runs them all) that panics leaves the
// Batcher running with no leader: every later Do waits forever. River
// recovers a worker's panic, so the process lives on with every ordered
// worker stuck (and River's Stop waiting on them). The hand-over must run
// however run ends (defer), and the panic reach the callers.
func TestAPanicInAScanDoesNotWedgeTheBatcher(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := New(setup(t), 100, 1, time.Minute)
	func() {
		defer func() { _ = recover() }()
		_ = b.Do(ctx, &Item{SQL: "SELECT 1", Scan: func(rows pgx.Rows) error {
			rows.Close() // give the connection back to the pool
			panic("a Scan panicked")
		}})
	}()
	it, r := item("", 7, 0)
	done := make(chan error, 1)
	go func() { done <- b.Do(ctx, it) }()
	select {
	case err := <-done:
		require.NoError(t, err)
		require.Equal(t, 7, r.v)
	case <-time.After(30 * time.Second):
		// Hand the waiter the lead by hand, so that it ends (goleak).
		b.mu.Lock()
		next := b.takeLocked()
		next[0].batch = next
		next[0].wake <- true
		b.mu.Unlock()
		<-done
		t.Fatal("Do never returned: an earlier batch's Scan panicked and the Batcher stayed running with no leader")
	}
}
