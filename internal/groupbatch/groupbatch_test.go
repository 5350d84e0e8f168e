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
	require.Eventually(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.running }, 10*time.Second, time.Millisecond)
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
	b := New(setup(t), 100, time.Minute)
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
	b := New(setup(t), 4, time.Minute)
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
	b := New(setup(t), 100, time.Minute)
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
	b := New(pool, 100, time.Minute)
	first, r0 := item("", 0, 0.3)
	var wg sync.WaitGroup
	wg.Go(func() { r0.err = b.Do(ctx, first) })
	require.Eventually(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.running }, 10*time.Second, time.Millisecond)
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
	b := New(setup(t), 100, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	it, r := item("", 7, 0)
	require.NoError(t, b.Do(ctx, it))
	require.Equal(t, 7, r.v)
}
