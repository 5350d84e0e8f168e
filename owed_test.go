package events

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

// oweTo writes n events of type typ, fanned out to every subscriber but
// sub, and owes each to sub: the rows a relay's stamp leaves while sub is
// paused, written in one statement so that a large backlog costs the test
// a second rather than a drain of its own.
func oweTo(t *testing.T, pool *pgxpool.Pool, sub, typ string, n int) {
	t.Helper()
	exec(t, pool, `WITH e AS (
		INSERT INTO outbox_events (id, type, subject, fanned_out_at, fanout)
		SELECT gen_random_uuid(), $2, 'subject:' || (g % 100), now(), '{}' FROM generate_series(1, $3::int) g
		RETURNING seq)
		INSERT INTO outbox_deliveries (event_seq, subscriber) SELECT seq, $1 FROM e`, sub, typ, n)
}

// A resumed subscriber's backlog of owed pairs does not hold back a fresh
// event of another subscriber: the relay serves the pending lane and the
// deliveries lane from one budget, a round each, so the fresh event waits
// for a round of the backlog, not for all of it. The bound is relative, and
// so free of the machine's speed: when the fresh event is fanned out, most
// of the backlog must still be owed (before, the deliveries lane was
// drained to the end first: nothing was left).
//
// With more than one round in flight the extra rounds drain the backlog and
// the main loop stays on fresh events; with one, the lanes take turns.
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
	oweTo(t, b.pool, "slow", "slow.changed", backlog)
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
// (pg_stat_database's tuples returned and fetched, which do not depend on
// the machine's speed). Before, every round's claim read and sorted every
// due pair: four times the backlog read about four times as many rows per
// pair.
func TestAnOwedDrainReadsAsManyRowsPerPairWhateverTheBacklog(t *testing.T) {
	t.Parallel()
	const n = 1_000
	small := owedDrainRowsPerPair(t, n)
	large := owedDrainRowsPerPair(t, 4*n)
	t.Logf("rows read per delivered pair: %.1f for %d pairs, %.1f for %d", small, n, large, 4*n)
	require.Less(t, large, 1.5*small, "rows read per pair grow with the backlog: %.1f for %d pairs, %.1f for %d", small, n, large, 4*n)
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
	oweTo(t, pool, "slow", "slow.changed", n)
	exec(t, pool, "ANALYZE")
	require.NoError(t, outbox.ResumeSubscriber(ctx, pool, "slow"))
	pool.Close()

	rowsRead := func() int64 {
		conn, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		defer conn.Close(ctx)
		var rows int64
		require.NoError(t, conn.QueryRow(ctx,
			"SELECT tup_returned + tup_fetched FROM pg_stat_database WHERE datname = current_database()").Scan(&rows))
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
		var owed int
		require.NoError(t, drain.QueryRow(ctx, "SELECT count(*) FROM outbox_deliveries").Scan(&owed))
		if owed == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "%d of %d pairs still owed", owed, n)
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
	}, 10*time.Second, 5*time.Millisecond)
	after = rowsRead()
	return float64(after-before) / float64(n)
}

// Retiring is final, whichever path would owe the retired subscriber: an
// ordered subscriber's relay that defers a pair (an earlier event of its
// subject is still pending) after RetireSubscriber returned writes no pair
// for it. Before, the deferral wrote the pair, owed for ever (Stats().Owed
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
	first := uuid.Must(uuid.NewV7())
	exec(t, b.pool, "INSERT INTO outbox_events (id, type, subject) VALUES ($1, 'ledger.changed', 'account:1')", first)
	locker, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = locker.Rollback(ctx) }()
	_, err = locker.Exec(ctx, "SELECT 1 FROM outbox_events WHERE id = $1 FOR UPDATE", first)
	require.NoError(t, err)

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
	st, err := outbox.Stats(ctx, b.pool)
	require.NoError(t, err)
	require.Zero(t, st.Owed, "Stats counts a pair owed to the retired subscriber")
}
