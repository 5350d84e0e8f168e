package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/engine"
	"github.com/standmeet/events/internal/owedfloor"
	"github.com/standmeet/events/internal/statements"
	"github.com/standmeet/events/internal/testdb"
)

// A paused subscriber is attempted for nothing while paused: its events stay
// owed to it and the other subscribers' flow; resumed, it gets each once.
func TestPausedSubscriberIsOwedAndResumed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var calls atomic.Int32
	slow := Subscriber{Name: "slow", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			calls.Add(1)
			return testArgs{EventID: e.ID}, nil, nil
		}}
	b := setup(t, setupOpts{}, slow, mapSub("fast", false, "**"))
	b.start(t)
	b.settle(t)
	require.NoError(t, outbox.PauseSubscriber(ctx, b.pool, "slow"))
	require.ErrorIs(t, outbox.PauseSubscriber(ctx, b.pool, "nobody"), ErrUnknownSubscriber)
	es := b.record(t, Event{Type: "a"}, Event{Type: "b"}, Event{Type: "c"})
	waitFannedOut(t, b.pool, 10*time.Second)
	require.Eventually(t, func() bool { return len(loadJobs(t, b.pool)) == 3 }, 30*time.Second, 5*time.Millisecond)
	b.waitIdle(t)
	require.Zero(t, calls.Load(), "nothing is attempted for a paused subscriber")
	pairs := loadPairs(t, b.pool)
	for _, e := range es {
		require.Equal(t, pairRow{}, pairs[e.ID]["slow"], "event %s is owed to slow", e.ID)
	}
	st, err := outbox.GetStats(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, []string{"slow"}, st.Paused)
	require.EqualValues(t, 3, st.Owed)

	require.NoError(t, outbox.ResumeSubscriber(ctx, b.pool, "slow"))
	waitDelivered(t, b.pool, 10*time.Second)
	perPair := map[string]int{}
	for _, j := range loadJobs(t, b.pool) {
		perPair[j.Subscriber+" "+j.EventID.String()]++
	}
	require.Len(t, perPair, 6)
	for pair, n := range perPair {
		require.Equal(t, 1, n, pair)
	}
	require.EqualValues(t, 3, calls.Load())
}

// A subscriber's error is stored safely whatever its bytes — a multi-byte
// rune across the cut, a NUL byte, a megabyte — and OnPoison gets it as the
// subscriber returned it.
func TestPairErrorsAreStoredSafely(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	long := strings.Repeat("é", 1<<19) // 1 MiB, two bytes a rune
	msgs := map[string]string{
		"rune": strings.Repeat("a", engine.MaxPairErrorLength-3) + "€€",
		"nul":  "bad\x00byte",
		"huge": long,
	}
	var (
		mu  sync.Mutex
		got = map[string]error{}
	)
	sub := Subscriber{Name: "picky", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			return nil, nil, errors.New(msgs[e.Subject])
		}}
	b := setup(t, setupOpts{config: &RelayConfig{MaxAttempts: 1, OnPoison: func(_ context.Context, e Event, err error) {
		mu.Lock()
		defer mu.Unlock()
		got[e.Subject] = err
	}}}, sub)
	b.start(t)
	es := b.record(t, Event{Type: "a", Subject: "rune"}, Event{Type: "a", Subject: "nul"}, Event{Type: "a", Subject: "huge"})
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 3 }, 30*time.Second, 5*time.Millisecond)
	for _, e := range es {
		info, err := outbox.GetEvent(ctx, b.pool, e.ID)
		require.NoError(t, err)
		require.Len(t, info.Deliveries, 1)
		d := info.Deliveries[0]
		require.True(t, d.Poisoned())
		require.LessOrEqual(t, len(d.LastError), engine.MaxPairErrorLength)
		require.NotContains(t, d.LastError, "\x00")
		require.Equal(t, d.LastError, d.Errors[0].Error)
		mu.Lock()
		require.ErrorContains(t, got[e.Subject], msgs[e.Subject], "OnPoison gets the error as written")
		mu.Unlock()
		switch e.Subject {
		case "nul":
			require.Contains(t, d.LastError, `bad\x00byte`)
		case "rune", "huge":
			require.True(t, strings.HasSuffix(d.LastError, "…"), "cut, and the cut is marked")
		}
	}
}

// pendingBacklog inserts n pending events of type typ with no
// notification: a backlog that keeps a relay's batches full.
func pendingBacklog(t *testing.T, pool *pgxpool.Pool, typ string, n int) {
	t.Helper()
	exec(t, pool, `INSERT INTO outbox_events (id, type, subject)
		SELECT gen_random_uuid(), $1, 'subject:' || (g % 100) FROM generate_series(1, $2::int) g`, typ, n)
	exec(t, pool, "SELECT pg_notify('"+statements.ChannelEvents+"', '')")
}

// anyPending reports whether an event waits to be fanned out.
func anyPending(t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	var any bool
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT EXISTS (SELECT 1 FROM outbox_events WHERE fanned_out_at IS NULL AND poisoned_at IS NULL)").Scan(&any))
	return any
}

// fannedOut reports whether the event id is fanned out.
func fannedOut(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) bool {
	t.Helper()
	var fanned bool
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT fanned_out_at IS NOT NULL FROM outbox_events WHERE id = $1", id).Scan(&fanned))
	return fanned
}

// Owed pairs are served while the pending lane's batches come back full
// back to back: four times a second the main loop runs a round of the
// deliveries lane whoever else serves it. Found by review: a helper woken
// for full batches ran pending rounds only, and the main loop, which left
// the lane to the helpers once it had a backlog, never ran another round of
// it until the pending backlog was gone.
func TestOwedPairsAreServedWhileBatchesComeBackFull(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{config: &RelayConfig{BatchSize: 5}}, mapSub("fast", false, "fast.*"), mapSub("slow", false, "slow.*"))
	b.start(t)
	b.settle(t)
	pendingBacklog(t, b.pool, "fast.changed", 30_000) // full batches for many seconds at 5 a round
	testdb.OweTo(t, b.pool, "slow", "slow.changed", 20)
	require.Eventually(t, func() bool { return owedCount(t, b.pool) == 0 }, 30*time.Second, 20*time.Millisecond,
		"owed pairs wait while batches come back full")
	require.True(t, anyPending(t, b.pool), "the pending backlog drained first: the test proves nothing")
}

// A failed event's due retry runs while full batches and a backlog of owed
// pairs flow: neither lane keeps the main loop from its other duties. Found
// by review: with an owed backlog, a busy main loop never reached the
// retries (nor idled, where the poll runs them).
func TestRetriesRunWhileFullBatchesAndAnOwedBacklogFlow(t *testing.T) {
	t.Parallel()
	for _, rounds := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d rounds in flight", rounds), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t, setupOpts{config: &RelayConfig{MaxRoundsInFlight: rounds, BatchSize: 5}},
				mapSub("fast", false, "fast.*"), mapSub("slow", false, "slow.*"))
			b.start(t)
			b.settle(t)
			require.NoError(t, outbox.PauseSubscriber(ctx, b.pool, "slow"))
			testdb.OweTo(t, b.pool, "slow", "slow.changed", 10_000)
			pendingBacklog(t, b.pool, "fast.changed", 30_000)
			require.NoError(t, outbox.ResumeSubscriber(ctx, b.pool, "slow"))
			require.Eventually(t, func() bool { return owedCount(t, b.pool) < 10_000 }, 30*time.Second, 10*time.Millisecond,
				"the owed backlog is never served")

			// An event whose first fan-out failed, due for its retry now.
			retry := uuid.Must(uuid.NewV7())
			exec(t, b.pool, `INSERT INTO outbox_events (id, type, attempts, next_attempt_at, last_error)
				VALUES ($1, 'fast.retry', 1, now(), 'boom')`, retry)
			require.Eventually(t, func() bool { return fannedOut(t, b.pool, retry) }, 30*time.Second, 20*time.Millisecond,
				"the due retry waits for the backlogs")
			require.True(t, anyPending(t, b.pool) && owedCount(t, b.pool) > 0, "a backlog drained first: the test proves nothing")
		})
	}
}

// An ordered subscriber's owed pair whose blocker is an earlier event of
// its subject waiting for its retry (due now) is deferred to a time that is
// not already past: the retry runs, then the pair is delivered. Found by
// review: the pair was deferred to the blocker's due time, in the past, so
// every round claimed it again, the loop never reached the poll that runs
// the retry, and it spun for ever.
func TestAnOrderedPairBehindARetryingEventIsDeliveredAfterIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ledger := mapSub("ledger", false, "**")
	ledger.Ordered = true
	reg := setup(t, setupOpts{}, ledger)
	require.NoError(t, reg.relay.Start(ctx, reg.client)) // registers the subscriber
	require.NoError(t, reg.relay.Stop(ctx))
	first, second := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	exec(t, reg.pool, `INSERT INTO outbox_events (id, type, subject, attempts, next_attempt_at, last_error)
		VALUES ($1, 'ledger.changed', 'account:1', 1, now(), 'boom')`, first)
	exec(t, reg.pool, `INSERT INTO outbox_events (id, type, subject, fanned_out_at, fanout)
		VALUES ($1, 'ledger.changed', 'account:1', now(), '{}')`, second)
	exec(t, reg.pool, `INSERT INTO outbox_deliveries (event_seq, subscriber) SELECT seq, 'ledger' FROM outbox_events WHERE id = $1`, second)

	for _, rounds := range []int{1, 2} {
		b := setup(t, setupOpts{url: reg.url, config: &RelayConfig{MaxRoundsInFlight: rounds}}, ledger)
		b.start(t)
		require.Eventually(t, func() bool { return fannedOut(t, b.pool, first) && owedCount(t, b.pool) == 0 },
			30*time.Second, 20*time.Millisecond, "%d rounds in flight: the retrying event or the pair behind it is never served", rounds)
		require.NoError(t, b.relay.Stop(ctx))
		rows := loadRows(t, b.pool)
		require.Less(t, rows[first].Fanout["ledger"], rows[second].Fanout["ledger"], "the chain's order")
		if rounds == 1 {
			// Again with two rounds in flight: the same rows, owed anew.
			exec(t, b.pool, "TRUNCATE outbox_chains, outbox_chain_jobs")
			exec(t, b.pool, "UPDATE outbox_events SET fanned_out_at = NULL, fanout = NULL, attempts = 1, next_attempt_at = now() WHERE id = $1", first)
			exec(t, b.pool, "UPDATE outbox_events SET fanout = '{}' WHERE id = $1", second)
			exec(t, b.pool, `INSERT INTO outbox_deliveries (event_seq, subscriber) SELECT seq, 'ledger' FROM outbox_events WHERE id = $1`, second)
		}
	}
}

// A pair whose event row is gone (deleted by hand: the library never
// leaves one) does not take its subscriber's share of every round: the
// subscriber's other pairs are delivered. Found by review: the claim's
// per-subscriber limit came before the join with the events.
func TestPairsWithoutAnEventRowDoNotStarveTheSubscriber(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{config: &RelayConfig{BatchSize: 5}}, mapSub("slow", false, "slow.*"))
	b.start(t)
	b.settle(t)
	exec(t, b.pool, `INSERT INTO outbox_deliveries (event_seq, subscriber, next_attempt_at)
		SELECT 1000000000 + g, 'slow', now() - interval '1 hour' FROM generate_series(1, 5) g`)
	testdb.OweTo(t, b.pool, "slow", "slow.changed", 3)
	exec(t, b.pool, "SELECT pg_notify('"+statements.ChannelEvents+"', '')")
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(context.Background(),
			"SELECT count(*) FROM outbox_deliveries d JOIN outbox_events e ON e.seq = d.event_seq").Scan(&n))
		return n == 0
	}, 30*time.Second, 20*time.Millisecond, "the subscriber's pairs wait behind pairs without an event row")
}

// A resumed subscriber's backlog of owed pairs does not hold back a fresh
// event of another subscriber: the relay serves the pending lane and the
// deliveries lane from one budget, a round each, so the fresh event waits
// for a round of the backlog, not for all of it. The bound is relative, and
// so free of the machine's speed: when the fresh event is fanned out, most
// of the backlog must still be owed (before, the deliveries lane was
// drained to the end first: nothing was left).
//
// The main loop serves the backlog, a round after each pending round (one
// fresh event is no flow: full rounds), and with more than one round in
// flight the extra rounds join it.
func TestAFreshEventIsNotHeldBehindAnOwedBacklog(t *testing.T) {
	t.Parallel()
	for _, rounds := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d rounds in flight", rounds), func(t *testing.T) {
			t.Parallel()
			freshBehindBacklog(t, rounds)
		})
	}
}

func freshBehindBacklog(t *testing.T, rounds int) {
	ctx := context.Background()
	const backlog = 50_000
	b := setup(t, setupOpts{config: &RelayConfig{MaxRoundsInFlight: rounds}}, mapSub("slow", false, "slow.*"), mapSub("fast", false, "fast.*"))
	b.start(t)
	b.settle(t)
	require.NoError(t, outbox.PauseSubscriber(ctx, b.pool, "slow"))
	testdb.OweTo(t, b.pool, "slow", "slow.changed", backlog)
	require.Equal(t, backlog, owedCount(t, b.pool))

	require.NoError(t, outbox.ResumeSubscriber(ctx, b.pool, "slow"))
	require.Eventually(t, func() bool { return owedCount(t, b.pool) < backlog }, 30*time.Second, time.Millisecond,
		"the resumed subscriber's backlog is never served")
	fresh := b.record(t, Event{Type: "fast.changed"})[0]
	start := time.Now()
	var owedThen int
	require.Eventually(t, func() bool {
		var fanned bool
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT fanned_out_at IS NOT NULL FROM outbox_events WHERE id = $1`, fresh.ID).Scan(&fanned))
		if fanned {
			owedThen = owedCount(t, b.pool)
		}
		return fanned
	}, time.Minute, time.Millisecond, "the fresh event is never fanned out")
	t.Logf("fresh event fanned out after %v, with %d of %d pairs still owed", time.Since(start), owedThen, backlog)
	require.Greater(t, owedThen, backlog/2,
		"the fresh event waited for the backlog: it was fanned out with only %d of %d pairs left", owedThen, backlog)
	waitDelivered(t, b.pool, time.Minute)
}

// The rows the server reads per delivered pair do not grow with the
// backlog: draining N and 4N owed pairs reads about as many rows per pair
// (the rows and index entries read from the library's tables, which do
// not depend on the machine's speed; the catalogs' and River's do, through
// connections opened and maintenance run on a timer). Before, every round's claim read and sorted every
// due pair: four times the backlog read about four times as many rows per
// pair.
func TestAnOwedDrainReadsAsManyRowsPerPairWhateverTheBacklog(t *testing.T) {
	t.Parallel()
	const n = 1_000
	small := owedDrainRowsPerPair(t, n)
	large := owedDrainRowsPerPair(t, 4*n)
	t.Logf("rows read per delivered pair: %.1f for %d pairs, %.1f for %d", small, n, large, 4*n)
	// Reading every due pair per round gave about 4x; what is left of the
	// rows that grow with time rather than with work (the relay's looks,
	// River's maintenance) stays well below 2x on a busy machine.
	require.Less(t, large, 2*small, "rows read per pair grow with the backlog: %.1f for %d pairs, %.1f for %d", small, n, large, 4*n)
}

// owedDrainRowsPerPair owes n pairs to a paused subscriber on a database of
// its own, resumes it, lets a relay of batches of 50 drain them, and
// returns the rows the server read per pair meanwhile. Every connection
// that worked is closed before the counters are read: a backend reports
// its counts when it exits.
func owedDrainRowsPerPair(t *testing.T, n int) float64 {
	t.Helper()
	ctx := context.Background()
	url := testdb.URL(t)
	cfg := &RelayConfig{BatchSize: 50}
	subs := []Subscriber{mapSub("slow", false, "**")}

	// Register the subscriber, pause it and owe it n pairs.
	pool := testdb.Pool(t, url)
	b := setup(t, setupOpts{url: url, pool: pool, config: cfg}, subs...)
	require.NoError(t, b.relay.Start(ctx, b.client))
	require.NoError(t, b.relay.Stop(ctx))
	require.NoError(t, outbox.PauseSubscriber(ctx, pool, "slow"))
	testdb.OweTo(t, pool, "slow", "slow.changed", n)
	exec(t, pool, "ANALYZE")
	require.NoError(t, outbox.ResumeSubscriber(ctx, pool, "slow"))
	pool.Close()

	rowsRead := func() int64 {
		conn, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		defer conn.Close(ctx)
		var rows int64
		require.NoError(t, conn.QueryRow(ctx, `
			SELECT coalesce((SELECT sum(seq_tup_read) FROM pg_stat_user_tables WHERE relname LIKE 'outbox\_%'), 0)
			     + coalesce((SELECT sum(idx_tup_read) FROM pg_stat_user_indexes WHERE relname LIKE 'outbox\_%'), 0)`).Scan(&rows))
		return rows
	}
	before := rowsRead()

	drain, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	d := setup(t, setupOpts{url: url, pool: drain, config: cfg}, subs...)
	require.NoError(t, d.relay.Start(ctx, d.client))
	deadline := time.Now().Add(2 * time.Minute)
	for {
		d.waitIdle(t)
		// EXISTS reads one row: a count here would read every pair still
		// owed at each look, and the looks grow with the drain's time,
		// which a busy machine stretches.
		var owed bool
		require.NoError(t, drain.QueryRow(ctx, "SELECT EXISTS (SELECT FROM outbox_deliveries)").Scan(&owed))
		if !owed {
			break
		}
		require.True(t, time.Now().Before(deadline), "pairs still owed of %d after 2 minutes", n)
	}
	require.NoError(t, d.relay.Stop(ctx))
	drain.Close()
	// A backend reports its counts as it exits, just after the close.
	var after int64
	require.Eventually(t, func() bool {
		var left int
		conn, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		defer conn.Close(ctx)
		require.NoError(t, conn.QueryRow(ctx,
			"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()").Scan(&left))
		return left == 0
	}, 30*time.Second, 5*time.Millisecond)
	after = rowsRead()
	return float64(after-before) / float64(n)
}

// Retiring is final, whichever path would owe the retired subscriber: an
// ordered subscriber's relay that defers a pair (an earlier event of its
// subject is still pending) after RetireSubscriber returned writes no pair
// for it. Before, the deferral wrote the pair, owed for ever (GetStats().Owed
// stayed 1, and retention kept the event).
func TestARetiredSubscriberIsOwedNothingByAnOrderedDeferral(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ledger := mapSub("ledger", false, "**")
	ledger.Ordered = true
	b := setup(t, setupOpts{}, ledger)
	b.start(t)
	b.settle(t)

	// The subject's first event is pending and held by another
	// transaction, as a round in flight holds it: every later event of the
	// subject must wait for it, and its pair is deferred.
	// The running relay may fan an event out between its commit and the
	// lock: then the held event is another one, until one is held pending.
	var locker pgx.Tx
	for held := false; !held; {
		first := uuid.Must(uuid.NewV7())
		exec(t, b.pool, "INSERT INTO outbox_events (id, type, subject) VALUES ($1, 'ledger.changed', 'account:1')", first)
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, tx.QueryRow(ctx, "SELECT fanned_out_at IS NULL FROM outbox_events WHERE id = $1 FOR UPDATE", first).Scan(&held))
		if held {
			locker = tx
		} else {
			require.NoError(t, tx.Rollback(ctx))
		}
	}
	defer func() { _ = locker.Rollback(ctx) }()

	deferred := func(e Event) bool {
		_, owed := loadPairs(t, b.pool)[e.ID]["ledger"]
		return loadRows(t, b.pool)[e.ID].FannedOut && owed
	}
	second := b.record(t, Event{Type: "ledger.changed", Subject: "account:1"})[0]
	require.Eventually(t, func() bool { return deferred(second) }, 30*time.Second, 5*time.Millisecond,
		"the later event's pair is not deferred behind the held one")

	require.NoError(t, outbox.RetireSubscriber(ctx, b.pool, "ledger"))
	third := b.record(t, Event{Type: "ledger.changed", Subject: "account:1"})[0]
	require.Eventually(t, func() bool { return loadRows(t, b.pool)[third.ID].FannedOut }, 30*time.Second, 5*time.Millisecond)
	b.waitIdle(t)
	require.Empty(t, loadPairs(t, b.pool), "a pair is owed to the retired subscriber")
	st, err := outbox.GetStats(ctx, b.pool)
	require.NoError(t, err)
	require.Zero(t, st.Owed, "Stats counts a pair owed to the retired subscriber")
}

// A rolling deploy: relay A (the old release) knows {x}, relay B (the new
// one) knows {x, y}; both fan out while 2,000 events are recorded, then A
// stops. Every event recorded after B started has exactly one y job, named by
// its fanout, whichever relay claimed it; x got exactly one job each.
func TestRollingDeployNewSubscriberGetsEveryEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	oldRelease := setup(t, setupOpts{}, mapSub("x", false, "**"))
	oldRelease.start(t)
	before := oldRelease.record(t, Event{Type: "order.placed"}, Event{Type: "order.placed"})
	waitFannedOut(t, oldRelease.pool, 10*time.Second)

	newRelease := setup(t, setupOpts{url: oldRelease.url}, mapSub("x", false, "**"), mapSub("y", false, "order.*"))
	newRelease.start(t)

	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				es := make([]Event, 20)
				for k := range es {
					typ := "order.placed"
					if k%5 == 0 {
						typ = "note.changed" // y does not match these
					}
					es[k] = Event{Type: typ, Subject: fmt.Sprintf("s-%d-%d", w, i)}
				}
				oldRelease.record(t, es...)
			}
		}()
	}
	wg.Wait()
	waitFannedOut(t, oldRelease.pool, 30*time.Second)
	require.NoError(t, oldRelease.relay.Stop(ctx))

	require.Eventually(t, func() bool { return catchUpPending(t, newRelease) == 0 }, 30*time.Second, 10*time.Millisecond,
		"the new release never caught up")

	rows := loadRows(t, newRelease.pool)
	jobs := loadJobs(t, newRelease.pool)
	jobsOf := map[string]map[uuid.UUID][]int64{"x": {}, "y": {}}
	for id, j := range jobs {
		jobsOf[j.Subscriber][j.EventID] = append(jobsOf[j.Subscriber][j.EventID], id)
	}
	caughtUp := 0
	for id, r := range rows {
		require.True(t, r.FannedOut)
		require.Equal(t, []int64{r.Fanout["x"]}, jobsOf["x"][id], "event %s: x must have exactly the job its fanout names", id)
		if id == before[0].ID || id == before[1].ID {
			require.NotContains(t, r.Fanout, "y", "events fanned out before y existed do not reach it")
			continue
		}
		if r.Type != "order.placed" {
			require.NotContains(t, r.Fanout, "y")
			require.Empty(t, jobsOf["y"][id])
			continue
		}
		require.Contains(t, r.Fanout, "y", "event %s never reached the new subscriber", id)
		require.Equal(t, []int64{r.Fanout["y"]}, jobsOf["y"][id], "event %s: y must have exactly the job its fanout names", id)
		caughtUp++
	}
	require.Equal(t, 1600, caughtUp)
	t.Logf("%d events, %d jobs", len(rows), len(jobs))
}

// An old-style catch_up list, written by a relay of 0.1.0 during a rolling
// deploy (with 0.1.0's own stamp statement), is served by a relay of this
// version that knows the subscriber: exactly one job, fanout extended, the
// list cleared; names it lists that are retired are dropped.
func TestAnOldReleasesCatchUpListIsServed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	raw, err := os.ReadFile("testdata/v0.1.0_statements.json")
	require.NoError(t, err)
	var old map[string]string
	require.NoError(t, json.Unmarshal(raw, &old))

	b := setup(t, setupOpts{}, mapSub("x", false, "**"), mapSub("y", false, "order.*"))
	// The registry as the deploy left it: y registered by the new release,
	// z by one since retired.
	registerOther(t, b, mapSub("y", false, "order.*"))
	registerOther(t, b, mapSub("z", false, "**"))
	require.NoError(t, outbox.RetireSubscriber(ctx, b.pool, "z"))
	es := b.record(t, Event{Type: "order.placed"}, Event{Type: "note.changed"})
	// An old relay knowing only x claims and stamps them: catch_up = {y}.
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, old["ClaimBatch"], 10); err != nil {
			return err
		}
		var seqs []int64
		for _, e := range es {
			seqs = append(seqs, e.Seq)
		}
		_, err := tx.Exec(ctx, old["Stamp"], seqs, []string{`{"x":1}`, `{"x":2}`}, []string{"x"})
		return err
	}))
	_, err = b.pool.Exec(ctx, "UPDATE outbox_events SET catch_up = catch_up || ARRAY['z'] WHERE seq = $1", es[0].Seq)
	require.NoError(t, err)
	require.Equal(t, 2, owedCount(t, b.pool), "0.1.0 wrote catch_up lists")

	b.start(t)
	waitDelivered(t, b.pool, 10*time.Second)
	rows := loadRows(t, b.pool)
	jobs := loadJobs(t, b.pool)
	require.Len(t, jobs, 1, "one job: y's, for the order event")
	for _, j := range jobs {
		require.Equal(t, "y", j.Subscriber)
		require.Equal(t, es[0].ID, j.EventID)
		require.Equal(t, map[string]int64{"x": 1, "y": j.ID}, rows[es[0].ID].Fanout)
	}
	require.Equal(t, map[string]int64{"x": 2}, rows[es[1].ID].Fanout, "y's types do not match the note")
	require.Empty(t, loadPairs(t, b.pool))
}

// A backlog drains at full speed, the helper loops joining the main loop in
// full batches, unless fresh events flow: then the main loop alone serves
// it, an eighth of a batch after each pending round, so a fresh event waits
// for at most one short round of the backlog and the backlog keeps one
// server backend busy, not two (engine.owedShare says what that bought). A
// trickle does not count as a flow: ten fresh events a second, taken as
// one, made a 40,000-pair drain two to five times slower (eventsbench's
// backlog section).
func TestABacklogGetsShortRoundsOfTheMainLoopOnlyWhileFreshEventsFlow(t *testing.T) {
	t.Parallel()
	type owedRound struct {
		helper bool
		batch  int
	}
	// drain drains a backlog while fresh events are recorded every pace
	// (0: back to back), or none. Between two pending rounds of the main
	// loop, at most one of its rounds of the deliveries lane claims
	// anything: a fresh event waits for at most one round of the backlog.
	drain := func(t *testing.T, fresh bool, pace time.Duration) []owedRound {
		ctx := context.Background()
		const backlog = 10_000
		b := setup(t, setupOpts{}, mapSub("slow", false, "slow.*"), mapSub("fast", false, "fast.*"))
		var (
			mu     sync.Mutex
			rounds []owedRound
		)
		b.relay.eng.Hooks.OwedRound = func(helper bool, batch int) {
			mu.Lock()
			defer mu.Unlock()
			rounds = append(rounds, owedRound{helper, batch})
		}
		var owedInARow, mostInARow int // the main loop's rounds of the backlog since its last pending round
		b.relay.eng.Hooks.MainRound = func(l engine.Lane, claimed int) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case l == engine.LanePending:
				owedInARow = 0
			case claimed > 0:
				owedInARow++
				mostInARow = max(mostInARow, owedInARow)
			}
		}
		b.start(t)
		b.settle(t)
		require.NoError(t, outbox.PauseSubscriber(ctx, b.pool, "slow"))
		testdb.OweTo(t, b.pool, "slow", "slow.changed", backlog)
		resumed := time.Now()
		mu.Lock()
		rounds = nil // the rounds before the backlog found nothing
		mu.Unlock()
		require.NoError(t, outbox.ResumeSubscriber(ctx, b.pool, "slow"))
		done := make(chan struct{})
		var writer sync.WaitGroup
		if fresh {
			writer.Go(func() {
				for {
					b.record(t, Event{Type: "fast.changed"})
					select {
					case <-done:
						return
					case <-time.After(pace): // the load's shape, not a wait for a condition
					}
				}
			})
		}
		require.Eventually(t, func() bool { return owedCount(t, b.pool) == 0 }, time.Minute, 10*time.Millisecond,
			"the backlog was never drained")
		if fresh {
			require.True(t, b.relay.eng.FreshLast().After(resumed),
				"no fresh event was claimed during the drain: the test shows nothing")
		}
		close(done)
		writer.Wait()
		mu.Lock()
		defer mu.Unlock()
		require.LessOrEqual(t, mostInARow, 1, "the main loop ran rounds of the backlog back to back, a fresh event waiting for each")
		return slices.Clone(rounds)
	}
	// fullBatches checks that no round of the backlog was cut short, and
	// that a helper loop joined the drain.
	fullBatches := func(t *testing.T, rounds []owedRound, what string) {
		t.Helper()
		require.True(t, slices.ContainsFunc(rounds, func(r owedRound) bool { return r.helper }),
			"no helper loop served the backlog")
		for i, r := range rounds {
			require.Equal(t, BatchSizeDefault, r.batch, "round %d of %d (%+v): %s", i, len(rounds), r, what)
		}
	}

	t.Run("alone", func(t *testing.T) {
		t.Parallel()
		fullBatches(t, drain(t, false, 0), "a backlog with no fresh events was cut short")
	})
	t.Run("fresh events flowing", func(t *testing.T) {
		t.Parallel()
		rounds := drain(t, true, 0)
		short, helped := 0, 0
		for _, r := range rounds {
			if r.helper {
				helped++
			}
			if r.batch < BatchSizeDefault {
				require.False(t, r.helper, "a helper loop ran a short round: %+v", r)
				require.Equal(t, BatchSizeDefault/8, r.batch)
				short++
			}
		}
		t.Logf("%d of %d rounds of the backlog short, %d a helper loop's", short, len(rounds), helped)
		require.Positive(t, short, "the main loop never served the backlog in short rounds while fresh events flowed")
		// A helper loop may run a round when the flow pauses (none did in
		// four runs, one under the race detector); helper loops that served
		// the backlog alongside the main loop ran about two rounds for
		// every three short ones.
		require.LessOrEqual(t, helped, short/4, "the helper loops served the backlog while fresh events flowed")
	})
	t.Run("a trickle of fresh events", func(t *testing.T) {
		t.Parallel()
		fullBatches(t, drain(t, true, 500*time.Millisecond), "the backlog yielded to a trickle")
	})
}

// claimIndexEntriesRead is how many entries of the deliveries lane's claim
// index the server has read so far, this connection's included.
func claimIndexEntriesRead(t *testing.T, conn *pgx.Conn) int64 {
	t.Helper()
	return indexEntriesRead(t, conn, `^outbox_deliveries_claim_idx$`)
}

// Under a held snapshot, the pairs a drain served (deleted) leave their
// entries in the claim index, and VACUUM may not remove them: a claim that
// read the subscriber's range from its start stepped over every one of
// them, round after round, during the drain (n²/2 entries over a drain of
// n pairs) and at every idle pass after it (issue 31's "claims that do not
// step over the dead rows"). Claims start at the subscriber's floor: where
// the last committed round's claim ended. A pair owed later is still found
// from there.
func TestOwedClaimsStartAfterThePairsServedUnderAHeldSnapshot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const n, batch = 3_000, 100
	url := floorURL(t)
	cfg := &RelayConfig{BatchSize: batch}
	admin := testdb.Pool(t, url)
	b := setup(t, setupOpts{url: url, pool: admin, config: cfg}, mapSub("slow", false, "**"))
	require.NoError(t, b.relay.Start(ctx, b.client))
	require.NoError(t, b.relay.Stop(ctx))
	require.NoError(t, outbox.PauseSubscriber(ctx, admin, "slow"))
	testdb.OweTo(t, admin, "slow", "slow.changed", n)
	// Owed since the pause, a minute ago: due well before the slack the
	// floor leaves below the clock (owedfloor.Slack).
	exec(t, admin, "UPDATE outbox_deliveries SET next_attempt_at = now() - interval '1 minute'")
	exec(t, admin, "ANALYZE")
	holdSnapshot(t, url)
	require.NoError(t, outbox.ResumeSubscriber(ctx, admin, "slow"))

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	before := claimIndexEntriesRead(t, conn)

	// The drain, by a relay on a pool of its own: its backends report what
	// they read as they exit.
	pcfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	pcfg.ConnConfig.RuntimeParams["application_name"] = "owed-drain"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	d := setup(t, setupOpts{url: url, pool: pool, config: cfg}, mapSub("slow", false, "**"))
	d.relay.eng.Hooks.OwedLook = time.Hour // only the run's first claim looks from the start
	require.NoError(t, d.relay.Start(ctx, d.client))
	require.Eventually(t, func() bool {
		var owed bool
		require.NoError(t, conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM outbox_deliveries)").Scan(&owed))
		return !owed
	}, 60*time.Second, 10*time.Millisecond, "the pairs were not delivered")
	d.waitIdle(t)
	require.NoError(t, d.relay.Stop(ctx))
	pool.Close()
	require.Eventually(t, func() bool {
		var left int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'owed-drain'`).Scan(&left))
		return left == 0
	}, 30*time.Second, 5*time.Millisecond, "the drain's backends did not exit")
	drained := claimIndexEntriesRead(t, conn) - before
	t.Logf("claim index entries read by a drain of %d pairs in batches of %d: %d", n, batch, drained)
	// Each pair once, and the pairs of the other loop's round in flight
	// that a claim steps over (SKIP LOCKED): about 3n. From the start each
	// round, a drain reads about n²/(2·batch) = 45,000, and every idle
	// poll after it another n.
	require.Less(t, drained, int64(5*n), "the drain's claims walk the pairs served before them")

	// Its floor, as the next claims would start: a pair owed after the
	// drain is above it, and the n dead entries are below.
	claim := func(from owedfloor.Position) int {
		t.Helper()
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { require.NoError(t, tx.Rollback(ctx)) }()
		claimed, _, err := d.relay.eng.ClaimOwed(ctx, tx, []string{"slow"}, batch, []owedfloor.Position{from})
		require.NoError(t, err)
		return claimed
	}
	floors, look := d.relay.eng.OwedFloors().Next([]string{"slow"}, time.Now())
	require.False(t, look)
	before = claimIndexEntriesRead(t, conn)
	require.Zero(t, claim(owedfloor.Position{}))
	fromStart := claimIndexEntriesRead(t, conn) - before
	require.GreaterOrEqual(t, fromStart, int64(n), "the served pairs left no dead entries to step over")
	before = claimIndexEntriesRead(t, conn)
	require.Zero(t, claim(floors[0]))
	fromFloor := claimIndexEntriesRead(t, conn) - before
	t.Logf("claim index entries read by a claim from the start: %d; from the floor: %d", fromStart, fromFloor)
	require.Less(t, fromFloor, int64(batch))

	// So does an idle relay's poll for the next pair due.
	poll := func(from owedfloor.Position) {
		t.Helper()
		var waiting bool
		var secs *float64
		var xmin int64
		var started time.Time
		require.NoError(t, conn.QueryRow(ctx, d.relay.sql.Poll, []string{"slow"}, int64(0), int64(0), []int64(nil),
			[]time.Time{from.Due}, []int64{from.Seq}).Scan(&waiting, &secs, &xmin, &started))
	}
	before = claimIndexEntriesRead(t, conn)
	poll(floors[0])
	fromFloor = claimIndexEntriesRead(t, conn) - before
	t.Logf("claim index entries read by a poll from the floor: %d", fromFloor)
	require.Less(t, fromFloor, int64(batch), "the idle poll walks the pairs served before the floor")

	require.NoError(t, outbox.PauseSubscriber(ctx, admin, "slow"))
	testdb.OweTo(t, admin, "slow", "slow.changed", 1)
	require.NoError(t, outbox.ResumeSubscriber(ctx, admin, "slow"))
	require.Equal(t, 1, claim(floors[0]), "a pair owed after the drain is below the floor")
}
