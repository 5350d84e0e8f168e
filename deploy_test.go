package events

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/statements"
)

// catchUpPending counts what some subscriber still has to catch up: owed
// pairs, and 0.1.0's catch_up lists.
func catchUpPending(t *testing.T, b *testBundle) int {
	t.Helper()
	return owedCount(t, b.pool)
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

// Jobs of a Handle subscriber that no process knows end cleanly: cancelled
// once it is retired, snoozed (not failed, not retried for days) while it is
// active, since another release may know it.
func TestHandleJobsOfAnUnknownSubscriber(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{work: true})
	_, err := registerSubscribers(ctx, b.pool, defaultSQL(t), []string{"active-elsewhere", "removed"})
	require.NoError(t, err)
	require.NoError(t, outbox.RetireSubscriber(ctx, b.pool, "removed"))
	var ids [2]int64
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		for i, name := range []string{"active-elsewhere", "removed"} {
			res, err := b.client.InsertTx(ctx, tx, HandleArgs{Subscriber: name, Event: Event{ID: uuid.Must(uuid.NewV7()), Type: "a"}}, nil)
			if err != nil {
				return err
			}
			ids[i] = res.Job.ID
		}
		return nil
	}))
	state := func(id int64) (string, int) {
		var s string
		var attempt int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT state, attempt FROM river_job WHERE id = $1", id).Scan(&s, &attempt))
		return s, attempt
	}
	require.Eventually(t, func() bool { s, _ := state(ids[1]); return s == "cancelled" }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { s, _ := state(ids[0]); return s == "scheduled" }, 10*time.Second, 10*time.Millisecond)
	var snoozes int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT coalesce((metadata->>'snoozes')::int, 0) FROM river_job WHERE id = $1", ids[0]).Scan(&snoozes))
	require.Equal(t, 1, snoozes, "snoozed, not failed")
}

// Subscribe accepts exactly the names whose job tag River accepts, within the
// library's own stricter rules (lowercase, at most 64 characters).
func TestSubscriberNamesAreTheOnesRiverAcceptsAsTags(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	riverAccepts := func(name string) bool {
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := b.client.InsertTx(ctx, tx, testArgs{}, &river.InsertOpts{Tags: []string{tagSubscriber + name}})
			if err != nil {
				return err
			}
			return errRollback
		})
		return errors.Is(err, errRollback)
	}
	long := func(n int) string { return fmt.Sprintf("%0*d", n, 7) }
	for _, name := range []string{"a", "_", "0", "a_", "a-b", "-a", "_-_", "a--b", long(64), // accepted
		"", "-", "a-", "--", "ab-", "a.b", "a b", "é", "a\n"} { // refused by River too
		_, err := newSubscription(mapSub(name, false, "**"))
		require.Equal(t, riverAccepts(name), err == nil, "name %q: Subscribe says %v", name, err)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidSubscriber)
			require.Contains(t, err.Error(), "Name")
		}
	}
	// The library's own, stricter rules.
	for _, name := range []string{long(65), "A", "a-B"} {
		_, err := newSubscription(mapSub(name, false, "**"))
		require.ErrorIs(t, err, ErrInvalidSubscriber, name)
	}
}

var errRollback = fmt.Errorf("rollback")

// defaultSQL is the statements of the default schema.
func defaultSQL(t *testing.T) *statements.Set {
	t.Helper()
	s, err := statements.For("")
	require.NoError(t, err)
	return s
}
