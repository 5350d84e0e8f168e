package events

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// The catch-up lane reads each event once per subscriber set that lacked a
// subscriber: a relay that knows none of the missing names never claims the
// row, and a retired subscriber leaves every event's catch-up list.
func TestRetiredSubscriberIsNeitherCaughtUpNorFannedOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// "gone" was registered by a release that no longer runs.
	b := setup(t, setupOpts{}, mapSub("x", false, "**"))
	_, err := registerSubscribers(ctx, b.pool, defaultSQL(t), []string{"gone"})
	require.NoError(t, err)
	b.start(t)
	b.record(t, Event{Type: "a"}, Event{Type: "b"})
	waitFannedOut(t, b.pool, 10*time.Second)
	require.Equal(t, 2, catchUpPending(t, b), "stamped by a relay lacking gone: both wait for it")

	list, err := outbox.ListSubscribers(ctx, b.pool)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, "gone", list[0].Name)
	require.True(t, list[0].RetiredAt.IsZero())

	require.NoError(t, outbox.RetireSubscriber(ctx, b.pool, "gone"))
	require.NoError(t, outbox.RetireSubscriber(ctx, b.pool, "gone"), "retiring twice is fine")
	require.ErrorIs(t, outbox.RetireSubscriber(ctx, b.pool, "never"), ErrUnknownSubscriber)
	require.Equal(t, 0, catchUpPending(t, b))
	list, err = outbox.ListSubscribers(ctx, b.pool)
	require.NoError(t, err)
	require.False(t, list[0].RetiredAt.IsZero())

	// New events no longer wait for it.
	b.record(t, Event{Type: "c"})
	waitFannedOut(t, b.pool, 10*time.Second)
	require.Equal(t, 0, catchUpPending(t, b))

	// A relay started with a retired subscriber leaves it out.
	again := setup(t, setupOpts{url: b.url}, mapSub("gone", false, "**"))
	again.start(t)
	e := again.record(t, Event{Type: "d"})[0]
	waitFannedOut(t, again.pool, 10*time.Second)
	require.NotContains(t, loadRows(t, again.pool)[e.ID].Fanout, "gone")
}

// A subscriber registered by a deploy that was rolled back, and never run
// again: it is owed only the events its types match; once no relay has
// served it for OrphanAfter it is reported orphaned by Health, Stats and a
// warning naming the fix; retention deletes every event that owes nothing
// and keeps the ones owed to it; retiring it lets retention take those too.
func TestAnOrphanedSubscriberIsReportedAndRetentionPrunesWhatOwesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Long enough that the relay's own heartbeats (every OrphanAfter / 3)
	// keep its subscriber served on a busy machine under -race.
	const orphanAfter = 6 * time.Second
	logs := &syncBuffer{}
	b := setup(t, setupOpts{config: &RelayConfig{
		Outbox: Outbox{OrphanAfter: orphanAfter}, Retention: time.Millisecond, RetentionInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}}, mapSub("x", false, "**"))
	registered := time.Now() // before ghost's registration: no later than its last_served_at
	registerOther(t, b, mapSub("ghost", false, "order.*"))
	b.start(t)
	b.settle(t)
	es := make([]Event, 40)
	for i := range es {
		es[i] = Event{Type: []string{"order.placed", "note.changed"}[i%2]}
	}
	es = b.record(t, es...)
	waitFannedOut(t, b.pool, 10*time.Second)
	// Not before OrphanAfter: reported orphaned now, it must be OrphanAfter
	// since its registration (on a busy machine the events may take that
	// long to fan out).
	if orphaned := b.relay.Health().Orphaned; len(orphaned) > 0 {
		require.GreaterOrEqual(t, time.Since(registered), orphanAfter, "orphaned before OrphanAfter: %v", orphaned)
	}

	require.Eventually(t, func() bool { return len(b.relay.Health().Orphaned) == 1 }, orphanAfter+30*time.Second, 5*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(registered), orphanAfter)
	require.Equal(t, []string{"ghost"}, b.relay.Health().Orphaned)
	require.True(t, b.relay.Healthy(), "an orphan is not this relay's fault")
	st, err := Outbox{OrphanAfter: orphanAfter}.GetStats(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, []string{"ghost"}, st.Orphaned)
	require.EqualValues(t, 20, st.Owed, "only the events ghost's types match are owed to it")
	st, err = outbox.GetStats(ctx, b.pool)
	require.NoError(t, err)
	require.Empty(t, st.Orphaned, "the default OrphanAfter is 15 minutes")
	require.Contains(t, logs.String(), "subscriber=ghost")
	require.Contains(t, logs.String(), "RetireSubscriber")

	// Retention: every event that owes nothing goes; the owed ones stay.
	require.Eventually(t, func() bool { return len(loadRows(t, b.pool)) == 20 }, 30*time.Second, 10*time.Millisecond)
	rows := loadRows(t, b.pool)
	for _, e := range es {
		_, kept := rows[e.ID]
		require.Equal(t, e.Type == "order.placed", kept, "event %s (%s)", e.ID, e.Type)
	}
	relays, err := outbox.ListRelays(ctx, b.pool)
	require.NoError(t, err)
	require.Len(t, relays, 1)
	require.Equal(t, []string{"x"}, relays[0].Subscribers)
	require.Equal(t, os.Getpid(), relays[0].PID)
	require.True(t, relays[0].StoppedAt.IsZero())

	require.NoError(t, outbox.RetireSubscriber(ctx, b.pool, "ghost"))
	require.Eventually(t, func() bool { return len(loadRows(t, b.pool)) == 0 }, 30*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return len(b.relay.Health().Orphaned) == 0 }, 30*time.Second, 5*time.Millisecond)
}

// RetireSubscriber while relays stamp: a relay that lacks the subscriber
// keeps writing pairs owed to it, and one that knows it serves them; once
// RetireSubscriber returns, nothing owes the retired name, and nothing ever
// does again (no stamp in flight writes it back). 50 times.
func TestRetireSubscriberWhileRelaysStamp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	loops := 50
	if testing.Short() {
		loops = 10
	}
	for i := range loops {
		lacking := setup(t, setupOpts{config: &RelayConfig{BatchSize: 20}}, mapSub("x", false, "**"))
		registerOther(t, lacking, mapSub("gone", false, "**"))
		lacking.start(t)
		func() {
			var (
				stop    = make(chan struct{})
				stopped bool
				writers sync.WaitGroup
			)
			halt := func() {
				if !stopped {
					stopped = true
					close(stop)
					writers.Wait()
				}
			}
			defer halt()
			for range 2 {
				writers.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						if err := pgx.BeginFunc(ctx, lacking.pool, func(tx pgx.Tx) error {
							_, err := RecordMany(ctx, tx, []Event{{Type: "a"}, {Type: "b"}, {Type: "c"}, {Type: "d"}})
							return err
						}); err != nil {
							t.Errorf("recording: %v", err)
							return
						}
					}
				})
			}
			// Let pairs pile up, then retire in the middle of it.
			require.Eventually(t, func() bool { return owedCount(t, lacking.pool) >= 20 }, 30*time.Second, time.Millisecond)
			require.NoError(t, outbox.RetireSubscriber(ctx, lacking.pool, "gone"))
			owedToGone := func() int {
				var n int
				require.NoError(t, lacking.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_deliveries WHERE subscriber = 'gone')
					+ (SELECT count(*) FROM outbox_events WHERE catch_up @> ARRAY['gone'])`).Scan(&n))
				return n
			}
			require.Zero(t, owedToGone(), "loop %d: owed to the retired name right after RetireSubscriber", i)
			halt()
			waitFannedOut(t, lacking.pool, 10*time.Second)
			require.Zero(t, owedToGone(), "loop %d: a stamp in flight wrote the retired name back", i)
		}()
		require.NoError(t, lacking.relay.Stop(ctx))
	}
}
