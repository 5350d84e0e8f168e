package events

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/maintenance"
)

// insertAged inserts n events fanned out age ago (or in the given state) by
// plain SQL, and returns their IDs.
func insertAged(t *testing.T, b *testBundle, n int, set string) []uuid.UUID {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `INSERT INTO outbox_events (id, type, fanout, `+set+`)
		SELECT gen_random_uuid(), 'aged', '{}', `+setValues[set]+` FROM generate_series(1, $1) RETURNING id`, n)
	require.NoError(t, err)
	var ids []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	return ids
}

var setValues = map[string]string{
	"fanned_out_at":                         "now() - interval '2 hours'",
	"poisoned_at, attempts":                 "now() - interval '2 hours', 5",
	"fanned_out_at, catch_up":               "now() - interval '2 hours', ARRAY['ghost']",
	"attempts, next_attempt_at, created_at": "1, now() + interval '1 hour', now() - interval '2 hours'",
}

// Retention deletes exactly the fanned-out events older than it: never
// pending, retrying, poisoned or still-to-be-caught-up ones, nor recent ones;
// it deletes in batches of at most 5,000; and a receipt of a deleted event is
// ErrNotFound.
func TestRetentionDeletesOnlyOldFannedOutEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{config: &RelayConfig{Retention: time.Hour}}, mapSub("audit", false, "**"))
	_, err := registerSubscribers(ctx, b.pool, defaultSQL(t), []string{"ghost"})
	require.NoError(t, err)
	old := insertAged(t, b, 12_000, "fanned_out_at")
	poisoned := insertAged(t, b, 3, "poisoned_at, attempts")
	catchingUp := insertAged(t, b, 3, "fanned_out_at, catch_up")
	retrying := insertAged(t, b, 3, "attempts, next_attempt_at, created_at")
	recent := b.record(t, Event{Type: "recent"}, Event{Type: "recent"})

	var (
		mu    sync.Mutex
		sizes []int
	)
	b.relay.hooks.pruning = func(size int) {
		mu.Lock()
		defer mu.Unlock()
		sizes = append(sizes, size)
	}
	b.relay.config.RetentionInterval = 20 * time.Millisecond
	b.start(t)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE id = ANY($1)", old).Scan(&n))
		return n == 0
	}, 30*time.Second, 20*time.Millisecond, "old fanned-out events are still there")

	rows := loadRows(t, b.pool)
	for _, ids := range [][]uuid.UUID{poisoned, catchingUp, retrying} {
		for _, id := range ids {
			require.Contains(t, rows, id, "retention deleted an event it must keep")
		}
	}
	for _, e := range recent {
		require.True(t, rows[e.ID].FannedOut)
	}
	mu.Lock()
	require.GreaterOrEqual(t, len(sizes), 3, "12,000 rows take at least three batches")
	for _, s := range sizes {
		require.LessOrEqual(t, s, maintenance.PruneBatchMax)
	}
	mu.Unlock()

	a := startAwaiter(t, b, &AwaiterConfig{NotFoundGrace: 50 * time.Millisecond})
	_, err = a.AwaitFanout(within(t, 30*time.Second), old[0])
	require.ErrorIs(t, err, ErrNotFound)
	_, err = outbox.GetEvent(ctx, b.pool, old[0])
	require.ErrorIs(t, err, ErrNotFound)
}

// A negative Retention keeps everything.
func TestNegativeRetentionKeepsEverything(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{config: &RelayConfig{Retention: -1}}, mapSub("audit", false, "**"))
	old := insertAged(t, b, 10, "fanned_out_at")
	var pruned atomic.Bool
	var passes atomic.Int32
	b.relay.hooks.pruning = func(int) { pruned.Store(true) }
	b.relay.hooks.prunePass = func() { passes.Add(1) }
	b.relay.config.RetentionInterval = time.Millisecond
	b.start(t)
	require.Eventually(t, func() bool { return passes.Load() >= 3 }, 30*time.Second, time.Millisecond, "retention passes ran")
	require.False(t, pruned.Load(), "a pass deleted with Retention negative")
	require.Contains(t, loadRows(t, b.pool), old[0])
}

func TestDiscardOnlyPoisonedEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	poisoned := insertAged(t, b, 1, "poisoned_at, attempts")[0]
	fanned := insertAged(t, b, 1, "fanned_out_at")[0]
	discard := func(id uuid.UUID) (int64, error) {
		return outbox.Discard(ctx, b.pool, PoisonedFilter{EventIDs: []uuid.UUID{id}})
	}
	_, err := discard(fanned)
	require.ErrorIs(t, err, ErrNotPoisoned)
	_, err = discard(uuid.Must(uuid.NewV7()))
	require.ErrorIs(t, err, ErrNotFound)
	n, err := discard(poisoned)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	_, err = outbox.GetEvent(ctx, b.pool, poisoned)
	require.ErrorIs(t, err, ErrNotFound)
	_, err = discard(poisoned)
	require.ErrorIs(t, err, ErrNotFound)
}
