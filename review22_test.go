package events

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

// Review of 7c66495 (quietWatch, since removed: the previous release, 0.1.0,
// writes no own functions, and the rewrite raced concurrent InstallWatch
// calls) and of the re-check schedule.

// InstallWatch's go doc: "Installing the same spec again changes nothing",
// whatever the watch's literals hold (here a prefix reading like a notify
// call).
func TestReview22InstallWatchOfAnUnchangedWatchWritesNothingWhateverItsPrefix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	createNotes(t, pool, 1)
	w := Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed"},
		SubjectPrefix: "urn:x-hooks:outbox_notify():"}
	require.NoError(t, outbox.InstallWatch(ctx, pool, w))
	xmin := func() string {
		var x string
		require.NoError(t, pool.QueryRow(ctx, `SELECT p.xmin::text FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
			WHERE t.tgrelid = 'corpus_notes'::regclass`).Scan(&x))
		return x
	}
	before := xmin()
	require.NoError(t, outbox.InstallWatch(ctx, pool, w))
	require.Equal(t, before, xmin(),
		"InstallWatch of an unchanged watch rewrote its function: a SubjectPrefix holding \"outbox_notify()\" reads as a notifying body")
}

// Processes installing one watch at once (pods starting together) never
// fail: the first install (without lockWatch they all found no triggers,
// all created the same own function, and all but one failed on pg_proc's
// unique index, 23505), and an install of a watch already up to date, which
// writes nothing.
func TestReview22ConcurrentInstallWatches(t *testing.T) {
	t.Parallel()
	for _, first := range []bool{true, false} {
		name := map[bool]string{true: "first install", false: "up to date"}[first]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.New(t)
			createNotes(t, pool, 1)
			w := Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed"}}
			require.NoError(t, outbox.InstallWatch(ctx, pool, w))
			for round := range 20 {
				if first {
					require.NoError(t, outbox.RemoveWatch(ctx, pool, "", "corpus_notes", ""))
				}
				const n = 8
				errs := make(chan error, n)
				start := make(chan struct{})
				for range n {
					go func() {
						<-start
						errs <- outbox.InstallWatch(ctx, pool, w)
					}()
				}
				close(start)
				for range n {
					require.NoError(t, <-errs, "round %d: one of %d InstallWatch calls at once failed", round, n)
				}
			}
		})
	}
}

// Guard (the converse of TestReview21ALockedPendingRow…): while another
// session holds a pending row locked, so that every look leads to a claim
// of nothing, rows that keep arriving quietly (one every 10 ms, as trigger
// rows do) are still found by the re-checks: a claim that finds rows starts
// them over.
func TestReview22ALockedRowDoesNotStopTheRechecksWhileRowsKeepArriving(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{config: &RelayConfig{Listener: ListenerConfig{PollInterval: time.Hour}}}, mapSub("audit", false, "**"))
	b.start(t)
	b.quiesce(t)
	holdAPendingRow(t, b)
	loud := b.record(t, Event{Type: "loud"})[0]
	fannedWithin(t, b, loud.ID, 30*time.Second, "the notified event")
	for range 100 {
		exec(t, b.pool, "INSERT INTO outbox_events (id, type) VALUES ($1, 'quiet')", uuid.Must(uuid.NewV7()))
		time.Sleep(10 * time.Millisecond)
	}
	require.Eventually(t, func() bool {
		var left int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE type = 'quiet' AND fanned_out_at IS NULL").Scan(&left))
		return left == 0
	}, 5*time.Second, 5*time.Millisecond)
	var worst float64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT extract(epoch FROM max(fanned_out_at - created_at)) * 1000
		FROM outbox_events WHERE type = 'quiet'`).Scan(&worst))
	t.Logf("slowest quiet row: %.1f ms", worst)
	// Rows 10 ms apart keep the lull at tens of milliseconds (109 ms was
	// seen once under the race detector and a full parallel suite); a
	// schedule that stopped would leave them to the hourly poll (the
	// Eventually above), one that kept doubling to 512 ms and more.
	require.Less(t, worst, 500.0, "rows arriving every 10 ms waited for the poll: the re-checks stopped")
}
