package events

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// reviewArgs panics in the method named by Panic ("kind", "opts", "marshal").
type reviewArgs struct {
	EventID uuid.UUID `json:"event_id"`
	Panic   string    `json:"-"`
}

func (a reviewArgs) Kind() string {
	if a.Panic == "kind" {
		panic("review: Kind panicked")
	}
	return "test.review"
}

func (a reviewArgs) InsertOpts() river.InsertOpts {
	if a.Panic == "opts" {
		panic("review: InsertOpts panicked")
	}
	return river.InsertOpts{}
}

func (a reviewArgs) MarshalJSON() ([]byte, error) {
	if a.Panic == "marshal" {
		panic("review: MarshalJSON panicked")
	}
	return json.Marshal(map[string]uuid.UUID{"event_id": a.EventID})
}

// reviewSub maps events to reviewArgs; an event whose subject is "boom-<m>"
// (or whose payload says {"panic":"<m>"}) panics in method m.
func reviewSub(name string, ordered, coalesce bool) Subscriber {
	return Subscriber{Name: name, Types: []string{"**"}, Ordered: ordered, Coalesce: coalesce,
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			var p struct {
				Panic string `json:"panic"`
			}
			_ = json.Unmarshal(e.Payload, &p)
			return reviewArgs{EventID: e.ID, Panic: p.Panic}, nil, nil
		}}
}

func reviewEvent(subject, panicIn string) Event {
	return Event{Type: "a", Subject: subject, Payload: []byte(fmt.Sprintf(`{"panic":%q}`, panicIn))}
}

// fanOutTxOnce runs FanOutTx in a fresh transaction, committed on success,
// and reports a panic as a test failure rather than a crashed binary.
func fanOutTxOnce(t *testing.T, b *testBundle) (n int, err error) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	panicked := !assert.NotPanics(t, func() { n, err = b.relay.FanOutTx(ctx, tx, b.client) }, "FanOutTx panicked")
	if panicked {
		return 0, fmt.Errorf("panicked")
	}
	if err == nil {
		require.NoError(t, tx.Commit(ctx))
	}
	return n, err
}

// Job args whose own methods panic fail their pair, not the relay: the relay
// reads Kind and InsertOpts at plan time, River marshals inside its insert
// (insertMany recovers, and the batch is retried job by job). The pair is
// poisoned, the other subscriber and the other events go on.
func TestJobArgsPanickingAreChargedToTheirPair(t *testing.T) {
	t.Parallel()
	for method, want := range map[string]string{
		"kind":    `"panics": the job args' Kind or InsertOpts panicked: review: Kind panicked`,
		"opts":    `"panics": the job args' Kind or InsertOpts panicked: review: InsertOpts panicked`,
		"marshal": "River's insert (the job args' methods, insert hooks or middleware) panicked: review: MarshalJSON panicked",
	} {
		t.Run(method, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{config: &RelayConfig{RetryBackoff: 5 * time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond, MaxAttempts: 2}},
				reviewSub("panics", false, false), mapSub("audit", false, "**"))
			es := make([]Event, 10)
			for i := range es {
				es[i] = reviewEvent(fmt.Sprintf("ok-%d", i), "")
			}
			es[4] = reviewEvent("boom", method)
			es = b.record(t, es...)
			b.start(t)
			waitDelivered(t, b.pool, 20*time.Second)
			rows, pairs := loadRows(t, b.pool), loadPairs(t, b.pool)
			for i, e := range es {
				require.True(t, rows[e.ID].FannedOut, "event %d", i)
				require.Contains(t, rows[e.ID].Fanout, "audit", "event %d", i)
				if i == 4 {
					require.True(t, pairs[e.ID]["panics"].Poisoned)
					require.Contains(t, pairs[e.ID]["panics"].LastError, want)
					continue
				}
				require.Contains(t, rows[e.ID].Fanout, "panics", "event %d", i)
				require.Empty(t, pairs[e.ID], "event %d was charged for another's failure", i)
			}
			require.Len(t, loadJobs(t, b.pool), 19)
		})
	}
}

// 2. InsertOpts() is called by the relay itself (plan.go insertOpts) to
// build InsertManyParams, before insertMany's recover is in place.
func TestReviewPanicInsertOptsInFanOutTx(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, reviewSub("opts", false, false), mapSub("audit", false, "**"))
	es := b.record(t, reviewEvent("ok", ""), reviewEvent("boom", "opts"))
	_, err := fanOutTxOnce(t, b)
	require.NoError(t, err)
	rows, pairs := loadRows(t, b.pool), loadPairs(t, b.pool)
	require.Contains(t, rows[es[0].ID].Fanout, "opts")
	require.Contains(t, rows[es[1].ID].Fanout, "audit")
	require.Contains(t, pairs[es[1].ID]["opts"].LastError, "InsertOpts panicked")
}

// orderedCoalescePending builds a chain whose head is not done and whose
// tail is pending, so the next event's job replaces the tail.
func orderedCoalescePending(t *testing.T, b *testBundle) {
	t.Helper()
	for i := range 2 {
		b.record(t, reviewEvent("s", ""))
		n, err := fanOutTxOnce(t, b)
		require.NoError(t, err)
		require.Equal(t, 1, n, "round %d", i)
	}
	var pending int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM river_job WHERE state = 'pending'").Scan(&pending))
	require.Equal(t, 1, pending, "the chain has a pending tail")
}

// 3. Kind() of an ordered, coalescing subscriber's args is called by the
// relay (orderChains) to decide whether to replace the pending tail.
func TestReviewPanicOrderedCoalesceKind(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, reviewSub("chain", true, true), mapSub("audit", false, "**"))
	orderedCoalescePending(t, b)
	es := b.record(t, reviewEvent("s", "kind"), reviewEvent("other", ""))
	_, err := fanOutTxOnce(t, b)
	require.NoError(t, err)
	rows, pairs := loadRows(t, b.pool), loadPairs(t, b.pool)
	require.Contains(t, pairs[es[0].ID]["chain"].LastError, "Kind panicked")
	require.Contains(t, rows[es[1].ID].Fanout, "chain")
}

// 4. MarshalJSON of a job that replaces a pending tail is called by the
// relay (chainPlan.queue, json.Marshal): River never sees that job.
func TestReviewPanicOrderedCoalesceMarshal(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, reviewSub("chain", true, true), mapSub("audit", false, "**"))
	orderedCoalescePending(t, b)
	b.record(t, reviewEvent("s", "marshal"), reviewEvent("other", ""))
	_, err := fanOutTxOnce(t, b)
	// As when MarshalJSON returns an error: FanOutTx, which retries nothing
	// job by job, fails the call with an error that says why.
	require.ErrorContains(t, err, "MarshalJSON panicked")
}

// 5. FanOutTx, a recovered panic (MarshalJSON inside River): the host's tx
// is still usable, and what the call did to the other events.
func TestReviewPanicFanOutTxLeavesHostTxUsable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{}, reviewSub("marshals", false, false), mapSub("audit", false, "**"))
	b.record(t, reviewEvent("ok", ""), reviewEvent("boom", "marshal"), reviewEvent("ok2", ""))
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "CREATE TEMP TABLE host_work (x int)")
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO host_work VALUES (1)")
	require.NoError(t, err)
	_, err = b.relay.FanOutTx(ctx, tx, b.client)
	require.ErrorContains(t, err, "MarshalJSON panicked")
	var x int
	require.NoError(t, tx.QueryRow(ctx, "SELECT x FROM host_work").Scan(&x), "the host's tx is usable")
	require.Equal(t, 1, x)
	var jobs int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM river_job").Scan(&jobs))
	require.Zero(t, jobs, "the failed call's jobs were rolled back")
	require.NoError(t, tx.Commit(ctx))
}

// 6. An insert middleware that panics on River's error (a "strict"
// middleware) when PostgreSQL refuses one row (jsonb cannot hold \u0000):
// the panic value carries the *pgconn.PgError but %v drops it, and the
// round's transaction is aborted, so isRowFault's probe fails: the row is
// never charged, and the rows after it in the batch are held back.
func TestReviewPanicMiddlewareOnAbortedTx(t *testing.T) {
	t.Parallel()
	for _, panics := range []bool{false, true} {
		t.Run(fmt.Sprintf("panics=%v", panics), func(t *testing.T) {
			t.Parallel()
			reviewMiddlewareOnAbortedTx(t, panics)
		})
	}
}

// reviewMiddlewareOnAbortedTx: with panics false (control) the middleware
// returns River's error, and the bad pair is poisoned as usual.
func reviewMiddlewareOnAbortedTx(t *testing.T, panics bool) {
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
	ok := assert.Eventually(t, func() bool { return owedCount(t, b.pool) == 0 && countPending(t, b) == 0 }, 10*time.Second, 20*time.Millisecond)
	rows, pairs := loadRows(t, b.pool), loadPairs(t, b.pool)
	for i, e := range es {
		t.Logf("event %d fanned=%v fanout=%v attempts=%d pairs=%v", i, rows[e.ID].FannedOut, rows[e.ID].Fanout, rows[e.ID].Attempts, pairs[e.ID])
	}
	if !ok {
		t.Errorf("events after the refused one are still not fanned out")
	}
	require.True(t, pairs[es[2].ID]["audit"].Poisoned, "the refused pair is charged")
	require.Contains(t, pairs[es[2].ID]["audit"].LastError, "22P05")
}

func countPending(t *testing.T, b *testBundle) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox_events WHERE fanned_out_at IS NULL").Scan(&n))
	return n
}
