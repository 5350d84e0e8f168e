package events

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

// An insert middleware that panics on River's error (a "strict"
// middleware) when PostgreSQL refuses one row (jsonb cannot hold \u0000):
// the panic value carries the *pgconn.PgError but %v drops it, and the
// round's transaction is aborted, so isRowFault's probe fails: the row is
// never charged, and the rows after it in the batch are held back.
func TestPanicMiddlewareOnAbortedTx(t *testing.T) {
	t.Parallel()
	for _, panics := range []bool{false, true} {
		t.Run(fmt.Sprintf("panics=%v", panics), func(t *testing.T) {
			t.Parallel()
			middlewareOnAbortedTx(t, panics)
		})
	}
}

// middlewareOnAbortedTx: with panics false (control) the middleware
// returns River's error, and the bad pair is poisoned as usual.
func middlewareOnAbortedTx(t *testing.T, panics bool) {
	b := setup(t, setupOpts{config: &RelayConfig{RetryBackoff: 5 * time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond, MaxAttempts: 2}},
		Subscriber{Name: "audit", Types: []string{"**"},
			Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
				if e.Subject == "bad-args" {
					return testArgs{EventID: e.ID, Subject: "nul\x00"}, nil, nil
				}
				return testArgs{EventID: e.ID}, nil, nil
			}})
	strict := river.JobInsertMiddlewareFunc(func(ctx context.Context, p []*rivertype.JobInsertParams,
		doInner func(context.Context) ([]*rivertype.JobInsertResult, error),
	) ([]*rivertype.JobInsertResult, error) {
		res, err := doInner(ctx)
		if err != nil && panics {
			panic(err)
		}
		if err != nil {
			return nil, err
		}
		return res, nil
	})
	client, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{Logger: quietLogger(), Middleware: []rivertype.Middleware{strict}})
	require.NoError(t, err)
	b.client = client
	es := make([]Event, 6)
	for i := range es {
		es[i] = Event{Type: "a", Subject: fmt.Sprintf("ok-%d", i)}
	}
	es[2].Subject = "bad-args" // refused by PostgreSQL: jsonb cannot hold \u0000
	es = b.record(t, es...)
	b.start(t)
	// Until the bad pair is poisoned too: between its attempts (a backoff)
	// nothing may be due, and on a busy machine the test can look then.
	ok := assert.Eventually(t, func() bool {
		return owedCount(t, b.pool) == 0 && countPending(t, b) == 0 && loadPairs(t, b.pool)[es[2].ID]["audit"].Poisoned
	}, 30*time.Second, 20*time.Millisecond)
	rows, pairs := loadRows(t, b.pool), loadPairs(t, b.pool)
	for i, e := range es {
		t.Logf("event %d fanned=%v fanout=%v attempts=%d pairs=%v", i, rows[e.ID].FannedOut, rows[e.ID].Fanout, rows[e.ID].Attempts, pairs[e.ID])
	}
	if !ok {
		t.Errorf("events after the refused one are still not fanned out, or the refused pair not yet charged")
	}
	require.True(t, pairs[es[2].ID]["audit"].Poisoned, "the refused pair is charged")
	require.Contains(t, pairs[es[2].ID]["audit"].LastError, "22P05")
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
	info, err := outbox.GetEvent(ctx, b.pool, e.ID)
	require.NoError(t, err)
	require.Empty(t, info.Deliveries, "poisoned by a lost connection")
	require.EqualValues(t, 1, charged.Load(), "only the mapping failure counts")
	require.Len(t, info.Fanout, 1)
}

func countPending(t *testing.T, b *testBundle) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox_events WHERE fanned_out_at IS NULL").Scan(&n))
	return n
}
