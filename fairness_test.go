package events

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"
)

// Under a backlog that keeps every batch full, the relay's other duties
// still get their turn: an event whose first attempt failed is retried
// within its backoff plus a second, and retention deletes old rows, both
// while the backlog is still far above a batch. (The loop used to go
// straight on after each full batch and never reached the retry schedule;
// retention yielded for as long as the relay was busy.)
func TestBusyRelayStillRetriesAndPrunes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const (
		batch   = 20
		backlog = 6_000
		backoff = 200 * time.Millisecond
	)
	var (
		flakyFailedAt atomic.Int64 // unix nanos of the flaky event's failed attempt
		flakyFannedAt atomic.Int64 // and of its successful one
	)
	sub := Subscriber{Name: "slow", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			if e.Type == "flaky" {
				if flakyFailedAt.CompareAndSwap(0, time.Now().UnixNano()) {
					return nil, nil, errors.New("first attempt fails")
				}
				flakyFannedAt.Store(time.Now().UnixNano())
				return testArgs{EventID: e.ID}, nil, nil
			}
			// A slow subscriber keeps the backlog up: about 1 ms an event.
			time.Sleep(time.Millisecond)
			return testArgs{EventID: e.ID}, nil, nil
		}}
	b := setup(t, setupOpts{config: &RelayConfig{
		BatchSize: batch, MaxRoundsInFlight: 1, RetryBackoff: backoff, MaxRetryBackoff: backoff,
		Retention: time.Hour, RetentionInterval: 50 * time.Millisecond,
	}}, sub)
	b.record(t, Event{Type: "flaky"})
	exec(t, b.pool, `INSERT INTO outbox_events (id, type) SELECT gen_random_uuid(), 'load' FROM generate_series(1, $1::int)`, backlog)
	b.start(t)

	pending := func() int {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE fanned_out_at IS NULL").Scan(&n))
		return n
	}
	require.Eventually(t, func() bool { return flakyFannedAt.Load() != 0 }, 30*time.Second, time.Millisecond,
		"the failed event was not retried")
	left := pending()
	took := time.Duration(flakyFannedAt.Load() - flakyFailedAt.Load())
	t.Logf("retried %v after its failure, with %d events still pending", took, left)
	require.Greater(t, left, 10*batch, "the backlog must still be there for this to show anything")
	require.Less(t, took, backoff+time.Second, "a due retry waited for the backlog")

	// Old rows to delete, made while the relay is busy.
	require.True(t, b.relay.busy.Load(), "the relay's batches come back full")
	old := insertAged(t, b, 3_000, "fanned_out_at")
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE id = ANY($1)", old).Scan(&n))
		return n < len(old)
	}, 10*time.Second, 5*time.Millisecond, "retention made no progress while the relay was busy")
	require.Greater(t, pending(), 10*batch, "retention must have run while the backlog was still there")
}
