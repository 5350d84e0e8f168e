package events

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// BackfillSubscriber of 10,000 retained events to a new subscriber while writes go
// on and relays fan out: every matching event created since the time
// reaches it exactly once, including those it already had from its own
// relay's stamps (never a second time), and none before the time; a second
// BackfillSubscriber owes nothing more.
func TestBackfillOwesEachMatchingEventOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	old := setup(t, setupOpts{config: &RelayConfig{BatchSize: 500}}, mapSub("x", false, "**"))
	old.start(t)
	before := old.record(t, Event{Type: "order.placed"})[0]
	waitFannedOut(t, old.pool, 10*time.Second)
	since := time.Now()
	for range 20 {
		es := make([]Event, 500)
		for i := range es {
			es[i] = Event{Type: []string{"order.placed", "note.changed"}[i%2]}
		}
		old.record(t, es...)
	}
	waitFannedOut(t, old.pool, 60*time.Second)

	// The new subscriber's relay starts: from now on stamps reach it.
	newer := setup(t, setupOpts{url: old.url, config: &RelayConfig{BatchSize: 500}}, mapSub("x", false, "**"), mapSub("y", false, "order.*"))
	newer.start(t)
	stop := make(chan struct{})
	var writers sync.WaitGroup
	writers.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := pgx.BeginFunc(ctx, old.pool, func(tx pgx.Tx) error {
				_, err := RecordMany(ctx, tx, []Event{{Type: "order.placed"}, {Type: "note.changed"}})
				return err
			}); err != nil {
				t.Errorf("recording: %v", err)
				return
			}
		}
	})
	res, err := outbox.BackfillSubscriber(ctx, old.pool, "y", since)
	close(stop)
	writers.Wait()
	require.NoError(t, err)
	require.GreaterOrEqual(t, res.Owed, int64(5000), "the 5,000 order events recorded before y existed")
	waitDelivered(t, old.pool, 60*time.Second)

	again, err := outbox.BackfillSubscriber(ctx, old.pool, "y", since)
	require.NoError(t, err)
	require.Zero(t, again.Owed, "nothing more to owe")
	_, err = outbox.BackfillSubscriber(ctx, old.pool, "nobody", since)
	require.ErrorIs(t, err, ErrUnknownSubscriber)
	subs, err := outbox.ListSubscribers(ctx, old.pool)
	require.NoError(t, err)
	require.Equal(t, "y", subs[1].Name)
	require.False(t, subs[1].BackfillDoneAt.IsZero(), "progress is visible")

	rows := loadRows(t, old.pool)
	perEvent := map[uuid.UUID]int{}
	for _, j := range loadJobs(t, old.pool) {
		if j.Subscriber == "y" {
			perEvent[j.EventID]++
		}
	}
	orders := 0
	for id, r := range rows {
		if r.Type != "order.placed" || id == before.ID {
			require.Zero(t, perEvent[id], "event %s (%s) is not y's", id, r.Type)
			continue
		}
		orders++
		require.Equal(t, 1, perEvent[id], "event %s: y's jobs", id)
		require.NotZero(t, r.Fanout["y"])
	}
	require.Greater(t, orders, 5000)
	require.Len(t, perEvent, orders)
}
