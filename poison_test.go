package events

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/engine"
	"github.com/standmeet/events/internal/safetext"
	"github.com/standmeet/events/internal/testdb"
)

// In a batch of 50, one subscriber's mapping of one event always fails: the
// other subscriber's job for that event, and every job of the other 49, exist
// within 100 ms; the failing pair alone is retried with the backoff doubling,
// and poisoned for that subscriber only after exactly MaxAttempts attempts;
// the alert fires once; a requeue before the fix fails again, with the error
// history kept (and bounded); after the cause is fixed a requeue delivers the
// pair once; every other pair exactly once.
func TestOneBadPairIsPoisonedAloneAndRequeued(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var (
		fixed        atomic.Bool
		badCalls     atomic.Int32
		othersAtCall = map[int32]int{}
		mu           sync.Mutex
		alerts       []uuid.UUID
		delays       []time.Duration
	)
	var b *testBundle
	sub := Subscriber{Name: "mailer", Types: []string{"**"},
		Map: func(ctx context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			if e.Subject == "bad" && !fixed.Load() {
				n := badCalls.Add(1)
				var jobs int
				_ = b.pool.QueryRow(ctx, "SELECT count(*) FROM river_job").Scan(&jobs)
				mu.Lock()
				othersAtCall[n] = jobs
				mu.Unlock()
				return nil, nil, errors.New("template missing")
			}
			return testArgs{EventID: e.ID}, nil, nil
		}}
	b = setup(t, setupOpts{config: &RelayConfig{
		RetryBackoff: 20 * time.Millisecond, MaxRetryBackoff: 70 * time.Millisecond,
		OnPoison: func(_ context.Context, e Event, err error) {
			mu.Lock()
			defer mu.Unlock()
			alerts = append(alerts, e.ID)
			require.ErrorContains(t, err, "template missing")
		},
	}}, sub, mapSub("audit", false, "**"))
	b.relay.eng.Hooks.Charged = func(_ int64, _ int, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		delays = append(delays, d)
	}
	b.start(t)
	b.settle(t)
	es := make([]Event, 50)
	for i := range es {
		es[i] = Event{Type: "order.placed", Subject: fmt.Sprintf("order:%d", i)}
	}
	es[17].Subject = "bad"
	es = b.record(t, es...)
	bad := es[17]
	// The first round inserts every job it can: all but the bad pair's.
	// That they come before the bad pair's retries is checked below
	// (othersAtCall), whatever the machine's speed; this bound only tells
	// a stall.
	require.Eventually(t, func() bool { return len(loadJobs(t, b.pool)) == 99 }, 30*time.Second, time.Millisecond,
		"the other pairs' jobs never came")
	poisonedPair := func() bool {
		p, ok := loadPairs(t, b.pool)[bad.ID]["mailer"]
		return ok && p.Poisoned
	}
	require.Eventually(t, poisonedPair, 30*time.Second, 5*time.Millisecond)
	info, err := outbox.GetEvent(ctx, b.pool, bad.ID)
	require.NoError(t, err)
	require.False(t, loadRows(t, b.pool)[bad.ID].Poisoned, "the event is not poisoned as a whole: only its pair is")
	require.True(t, info.Poisoned(), "GetEvent reports the poisoned delivery")
	require.False(t, info.FannedOutAt.IsZero())
	require.Contains(t, info.Fanout, "audit")
	require.NotContains(t, info.Fanout, "mailer")
	require.Len(t, info.Deliveries, 1)
	d := info.Deliveries[0]
	require.Equal(t, "mailer", d.Subscriber)
	require.True(t, d.Poisoned())
	require.Equal(t, 5, d.Attempts)
	require.Contains(t, d.LastError, "template missing")
	require.Len(t, d.Errors, 5)
	require.EqualValues(t, 5, badCalls.Load(), "attempts")

	// OnPoison runs after the round that poisoned the pair has committed,
	// outside it: on a busy machine, after the pair reads poisoned.
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(alerts) > 0 }, 30*time.Second, 5*time.Millisecond,
		"OnPoison never ran")
	mu.Lock()
	require.Equal(t, 99, othersAtCall[2], "every other pair had its job before the bad one's second attempt")
	require.Equal(t, []time.Duration{20 * time.Millisecond, 40 * time.Millisecond, 70 * time.Millisecond, 70 * time.Millisecond, 70 * time.Millisecond}, delays)
	require.Equal(t, []uuid.UUID{bad.ID}, alerts)
	mu.Unlock()

	// Poisoned means set aside: not attempted again.
	b.waitIdle(t)
	require.EqualValues(t, 5, badCalls.Load())

	list, err := outbox.ListDeliveries(ctx, b.pool, ListDeliveriesParams{State: DeliveryPoisoned})
	require.NoError(t, err)
	require.Len(t, list.Deliveries, 1)
	require.Equal(t, bad.ID, list.Deliveries[0].EventID)
	list, err = outbox.ListDeliveries(ctx, b.pool, ListDeliveriesParams{State: DeliveryPoisoned, Subscriber: "audit"})
	require.NoError(t, err)
	require.Empty(t, list.Deliveries)
	events, err := outbox.ListEvents(ctx, b.pool, ListEventsParams{State: EventPoisoned})
	require.NoError(t, err)
	require.Len(t, events.Events, 1, "the event list shows it, by its poisoned pair")
	require.Contains(t, events.Events[0].LastError, "template missing")

	// Requeued before the fix: five more attempts, and the history keeps the
	// last ten.
	audit := PoisonedFilter{EventIDs: []uuid.UUID{bad.ID}, Subscriber: "audit"}
	mailer := PoisonedFilter{EventIDs: []uuid.UUID{bad.ID}, Subscriber: "mailer"}
	_, err = outbox.Requeue(ctx, b.pool, audit)
	require.ErrorIs(t, err, ErrNotFound, "audit got its job: nothing owed")
	n, err := outbox.Requeue(ctx, b.pool, mailer)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	_, err = outbox.Requeue(ctx, b.pool, mailer)
	require.ErrorIs(t, err, ErrNotPoisoned)
	require.Eventually(t, func() bool { return badCalls.Load() == 10 && poisonedPair() }, 30*time.Second, 5*time.Millisecond)
	p := loadPairs(t, b.pool)[bad.ID]["mailer"]
	require.Equal(t, 5, p.Attempts)
	require.Equal(t, 10, p.Errors, "the history survives the requeue, bounded")

	fixed.Store(true)
	_, err = outbox.Requeue(ctx, b.pool, mailer)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := outbox.GetEvent(ctx, b.pool, bad.ID)
		return err == nil && info.Fanout["mailer"] != 0
	}, 30*time.Second, 5*time.Millisecond)
	info, err = outbox.GetEvent(ctx, b.pool, bad.ID)
	require.NoError(t, err)
	require.Empty(t, info.Deliveries)
	perPair := map[string]int{}
	for _, j := range loadJobs(t, b.pool) {
		perPair[j.Subscriber+" "+j.EventID.String()]++
	}
	require.Len(t, perPair, 100)
	for pair, n := range perPair {
		require.Equal(t, 1, n, "jobs for %s", pair)
	}
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(alerts) >= 2 }, 30*time.Second, 5*time.Millisecond,
		"OnPoison never ran for the second poisoning")
	b.waitIdle(t)
	mu.Lock()
	require.Len(t, alerts, 2, "the alert fires once per poisoning")
	mu.Unlock()
}

func TestMappingThatFailsTwiceThenSucceedsIsNeverPoisoned(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	sub := Subscriber{Name: "flaky", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			if calls.Add(1) <= 2 {
				return nil, nil, errors.New("downstream config not loaded yet")
			}
			return testArgs{EventID: e.ID}, nil, nil
		}}
	b := setup(t, setupOpts{config: &RelayConfig{RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 20 * time.Millisecond}}, sub)
	e := b.record(t, Event{Type: "a"})[0]
	b.start(t)
	require.Eventually(t, func() bool {
		info, err := outbox.GetEvent(context.Background(), b.pool, e.ID)
		return err == nil && len(info.Fanout) == 1
	}, 30*time.Second, 5*time.Millisecond)
	info, err := outbox.GetEvent(context.Background(), b.pool, e.ID)
	require.NoError(t, err)
	require.False(t, info.Poisoned())
	require.Zero(t, info.Attempts, "the event itself never failed")
	require.Empty(t, info.Deliveries, "the pair is delivered: nothing owed")
	require.EqualValues(t, 3, calls.Load())
}

// A panic in Map is a failure of that event, not of the relay.
func TestPanickingMapIsChargedToItsEvent(t *testing.T) {
	t.Parallel()
	sub := Subscriber{Name: "panicky", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			if e.Subject == "boom" {
				panic("nil map")
			}
			return testArgs{EventID: e.ID}, nil, nil
		}}
	b := setup(t, setupOpts{config: &RelayConfig{RetryBackoff: 5 * time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond, MaxAttempts: 2}}, sub)
	es := b.record(t, Event{Type: "a", Subject: "boom"}, Event{Type: "a", Subject: "fine"})
	b.start(t)
	waitDelivered(t, b.pool, 10*time.Second)
	rows := loadRows(t, b.pool)
	pairs := loadPairs(t, b.pool)
	require.True(t, pairs[es[0].ID]["panicky"].Poisoned)
	require.Contains(t, pairs[es[0].ID]["panicky"].LastError, "panicked: nil map")
	require.False(t, rows[es[0].ID].Poisoned)
	require.True(t, rows[es[1].ID].FannedOut)
	require.Contains(t, rows[es[1].ID].Fanout, "panicky")
}

// Failures River or PostgreSQL report for a whole batch cannot be pinned on a
// row up front: the batch fails, and the row-by-row retry finds the culprits.
func TestBatchFailuresAreRetriedRowByRow(t *testing.T) {
	t.Parallel()
	sub := Subscriber{Name: "hooks", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			switch e.Subject {
			case "bad-queue": // refused by River before anything is sent
				return testArgs{EventID: e.ID}, &river.InsertOpts{Queue: "no spaces allowed"}, nil
			case "bad-args": // refused by PostgreSQL: jsonb cannot hold \u0000
				return testArgs{EventID: e.ID, Subject: "nul\x00"}, nil, nil
			}
			return testArgs{EventID: e.ID}, nil, nil
		}}
	var mu sync.Mutex
	var pauses []time.Duration
	b := setup(t, setupOpts{config: &RelayConfig{RetryBackoff: 5 * time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond, MaxAttempts: 3}}, sub)
	b.relay.eng.Hooks.Pause = func(_ context.Context, d time.Duration) bool {
		mu.Lock()
		defer mu.Unlock()
		pauses = append(pauses, d)
		return true
	}
	es := make([]Event, 20)
	for i := range es {
		es[i] = Event{Type: "a", Subject: fmt.Sprintf("ok-%d", i)}
	}
	es[3].Subject, es[11].Subject = "bad-queue", "bad-args"
	es = b.record(t, es...)
	b.start(t)
	waitDelivered(t, b.pool, 20*time.Second)
	rows := loadRows(t, b.pool)
	pairs := loadPairs(t, b.pool)
	for i, e := range es {
		r := rows[e.ID]
		require.True(t, r.FannedOut, "event %d", i)
		require.Zero(t, r.Attempts, "event %d was charged as a whole", i)
		switch i {
		case 3:
			require.True(t, pairs[e.ID]["hooks"].Poisoned)
			require.Contains(t, pairs[e.ID]["hooks"].LastError, "queue")
		case 11:
			require.True(t, pairs[e.ID]["hooks"].Poisoned)
			require.Contains(t, pairs[e.ID]["hooks"].LastError, "22P05")
		default:
			require.Empty(t, pairs[e.ID], "event %d was charged for another's failure", i)
		}
	}
	require.Len(t, loadJobs(t, b.pool), 18)
	mu.Lock()
	require.NotEmpty(t, pauses, "the failed batch was retried after a pause")
	mu.Unlock()
}

// A database failure is not a row's fault: rounds back off, doubling up to
// the cap, and no event is charged. Delays are recorded, not slept.
func TestRoundBackoffDoublesAndIsCapped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var (
		mu     sync.Mutex
		pauses []time.Duration
	)
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	enough := make(chan struct{})
	b.relay.eng.Hooks.Pause = func(_ context.Context, d time.Duration) bool {
		mu.Lock()
		pauses = append(pauses, d)
		n := len(pauses)
		mu.Unlock()
		if n == 8 {
			close(enough)
		}
		return n < 8 // then the loop ends; Stop still works
	}
	e := b.record(t, Event{Type: "a"})[0]
	_, err := b.pool.Exec(ctx, "ALTER TABLE outbox_events RENAME TO outbox_events_away")
	require.NoError(t, err)
	b.start(t)
	<-enough
	mu.Lock()
	require.Equal(t, []time.Duration{
		2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
		32 * time.Second, time.Minute, time.Minute, time.Minute,
	}, pauses[:8])
	mu.Unlock()
	_, err = b.pool.Exec(ctx, "ALTER TABLE outbox_events_away RENAME TO outbox_events")
	require.NoError(t, err)
	info, err := outbox.GetEvent(ctx, b.pool, e.ID)
	require.NoError(t, err)
	require.Zero(t, info.Attempts)
}

func TestListPoisonedPagesNewestFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	es := make([]Event, 7)
	for i := range es {
		es[i] = Event{Type: "a"}
	}
	es = b.record(t, es...)
	for i, e := range es {
		_, err := b.pool.Exec(ctx, "UPDATE outbox_events SET poisoned_at = now() - make_interval(mins => $2), attempts = 5, last_error = 'x' WHERE id = $1",
			e.ID, len(es)-i)
		require.NoError(t, err)
	}
	// The two newest share a poisoning time: the seq breaks the tie.
	_, err := b.pool.Exec(ctx, "UPDATE outbox_events SET poisoned_at = (SELECT max(poisoned_at) FROM outbox_events) WHERE id = $1", es[5].ID)
	require.NoError(t, err)

	var got []uuid.UUID
	params := ListEventsParams{State: EventPoisoned, Limit: 3}
	for {
		page, err := outbox.ListEvents(ctx, b.pool, params)
		require.NoError(t, err)
		require.LessOrEqual(t, len(page.Events), 3)
		for _, e := range page.Events {
			got = append(got, e.ID)
		}
		if page.Next == "" {
			break
		}
		params.After = page.Next
	}
	want := []uuid.UUID{es[6].ID, es[5].ID, es[4].ID, es[3].ID, es[2].ID, es[1].ID, es[0].ID}
	require.Equal(t, want, got)

	_, err = outbox.ListEvents(ctx, b.pool, ListEventsParams{State: EventPoisoned, After: "garbage"})
	require.ErrorContains(t, err, "After")
}

func TestRequeueRefusesWhatIsNotPoisoned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	e := b.record(t, Event{Type: "a"})[0]
	_, err := outbox.Requeue(ctx, b.pool, PoisonedFilter{EventIDs: []uuid.UUID{e.ID}})
	require.ErrorIs(t, err, ErrNotPoisoned)
	_, err = outbox.Requeue(ctx, b.pool, PoisonedFilter{EventIDs: []uuid.UUID{uuid.New()}})
	require.ErrorIs(t, err, ErrNotFound)
	_, err = outbox.GetEvent(ctx, b.pool, uuid.New())
	require.ErrorIs(t, err, ErrNotFound)
}

// An event failed by a relay that then died (it waits in the retry lane, and
// no notification will come) is retried by another, idle relay: idle relays
// read the retry schedule now and then.
func TestAnIdleRelayRetriesWhatADeadRelayFailed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	survivor := setup(t, setupOpts{config: &RelayConfig{RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 10 * time.Millisecond}},
		mapSub("mailer", false, "**"))
	survivor.start(t)
	survivor.settle(t)

	// The state a relay leaves when it charges an event and dies before the
	// retry; written by hand, without a notification.
	id := uuid.Must(uuid.NewV7())
	_, err := survivor.pool.Exec(ctx, `INSERT INTO outbox_events (id, type, attempts, last_error, next_attempt_at)
		VALUES ($1, 'order.placed', 1, 'the dead relay had no template', now() + interval '200 milliseconds')`, id)
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		info, err := outbox.GetEvent(ctx, survivor.pool, id)
		return err == nil && !info.FannedOutAt.IsZero()
	}, 30*time.Second, 10*time.Millisecond, "the idle relay never retried the event")
	info, err := outbox.GetEvent(ctx, survivor.pool, id)
	require.NoError(t, err)
	require.Equal(t, 1, info.Attempts)
	require.Len(t, info.Fanout, 1)
}

// An OnPoison that panics does not take the process down, and other events
// keep flowing.
func TestPanickingOnPoisonIsRecovered(t *testing.T) {
	t.Parallel()
	called := make(chan struct{}, 10)
	b := setup(t, setupOpts{config: poisonAtOnce(func(context.Context, Event, error) {
		called <- struct{}{}
		panic("pager exploded")
	})}, failingSub())
	b.start(t)
	for i := range 3 {
		b.record(t, Event{Type: "bad", Subject: fmt.Sprint(i)})
		<-called
	}
	good := b.record(t, Event{Type: "good"})[0]
	require.Eventually(t, func() bool { return loadRows(t, b.pool)[good.ID].FannedOut }, 30*time.Second, 5*time.Millisecond)
}

// An OnPoison that blocks delays nothing but itself: an unrelated event is
// fanned out while it is still blocked (it returns only when Stop cancels
// its context, so a relay that waited for it would never fan the event out:
// the bound only tells that stall from health, whatever the machine's
// speed).
func TestSlowOnPoisonHoldsBackNothing(t *testing.T) {
	t.Parallel()
	inCallback, returned := make(chan struct{}), make(chan struct{})
	b := setup(t, setupOpts{config: poisonAtOnce(func(ctx context.Context, _ Event, _ error) {
		defer close(returned)
		close(inCallback)
		<-ctx.Done()
	})}, failingSub())
	b.start(t)
	b.record(t, Event{Type: "bad"})
	<-inCallback
	good := b.record(t, Event{Type: "good"})[0]
	require.Eventually(t, func() bool { return loadRows(t, b.pool)[good.ID].FannedOut }, 30*time.Second, 2*time.Millisecond,
		"an unrelated event waited for OnPoison")
	select {
	case <-returned:
		t.Fatal("OnPoison returned before Stop")
	default:
	}
	// Stop waits for the callback within its context, then cancels it.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, b.relay.Stop(ctx), context.DeadlineExceeded)
}

// A subscriber's error text is the host's: it may split a rune where
// last_error is cut, hold a NUL byte, or be a megabyte long. Each is stored
// in a form PostgreSQL accepts, readable with GetEvent; OnPoison gets the
// error as the subscriber returned it; and the healthy events of the same
// batch go out in that very round, with no backoff.
func TestHostErrorTextIsStoredSafely(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const prefix = `subscriber "mailer": Map: `
	mapErrs := map[string]error{
		// The é takes bytes 1999 and 2000 of the stored message: a cut at
		// 2000 bytes splits it.
		"rune": errors.New(strings.Repeat("a", engine.MaxErrorLength-len(prefix)-1) + "é and more"),
		"nul":  errors.New("bad\x00byte"),
		"huge": errors.New(strings.Repeat("x", 1<<20)),
	}
	var (
		mu     sync.Mutex
		alerts = map[uuid.UUID]error{}
		pauses atomic.Int32
	)
	sub := Subscriber{Name: "mailer", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			if err, ok := mapErrs[e.Subject]; ok {
				return nil, nil, err
			}
			return testArgs{EventID: e.ID}, nil, nil
		}}
	b := setup(t, setupOpts{config: &RelayConfig{MaxAttempts: 1, OnPoison: func(_ context.Context, e Event, err error) {
		mu.Lock()
		defer mu.Unlock()
		alerts[e.ID] = err
	}}}, sub)
	b.relay.eng.Hooks.Pause = func(context.Context, time.Duration) bool {
		pauses.Add(1) // a failed round backs off
		return true
	}
	es := b.record(t,
		Event{Type: "a", Subject: "ok:1"}, Event{Type: "a", Subject: "rune"}, Event{Type: "a", Subject: "ok:2"},
		Event{Type: "a", Subject: "nul"}, Event{Type: "a", Subject: "ok:3"}, Event{Type: "a", Subject: "huge"},
		Event{Type: "a", Subject: "ok:4"})
	b.start(t)

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(alerts) == len(mapErrs)
	}, 30*time.Second, 5*time.Millisecond)
	require.Zero(t, pauses.Load(), "a round failed and backed off")

	var fannedAt []time.Time
	for _, e := range es {
		info, err := outbox.GetEvent(ctx, b.pool, e.ID)
		require.NoError(t, err)
		mapErr, bad := mapErrs[e.Subject]
		if !bad {
			require.False(t, info.FannedOutAt.IsZero(), "%s not fanned out", e.Subject)
			fannedAt = append(fannedAt, info.FannedOutAt)
			continue
		}
		require.True(t, info.Poisoned(), e.Subject)
		require.Equal(t, 1, info.Attempts, e.Subject)
		stored := info.LastError
		require.True(t, utf8.ValidString(stored), "%s: %q", e.Subject, stored)
		require.NotContains(t, stored, "\x00", e.Subject)
		require.LessOrEqual(t, len(stored), engine.MaxErrorLength, e.Subject)
		require.Equal(t, safetext.Clip(prefix+mapErr.Error(), engine.MaxErrorLength), stored, e.Subject)
		switch e.Subject {
		case "rune":
			require.Equal(t, prefix+strings.Repeat("a", engine.MaxErrorLength-len(prefix)-len(safetext.Ellipsis))+safetext.Ellipsis, stored)
		case "nul":
			require.Equal(t, prefix+`bad\x00byte`, stored)
		case "huge":
			require.True(t, strings.HasPrefix(stored, prefix+"xxxx"), stored[:100])
			require.True(t, strings.HasSuffix(stored, safetext.Ellipsis), "the cut is marked")
		}

		mu.Lock()
		got := alerts[e.ID]
		mu.Unlock()
		require.ErrorIs(t, got, mapErr, "OnPoison gets the subscriber's error")
		require.Contains(t, got.Error(), mapErr.Error(), "OnPoison gets the error text as written")
	}
	require.Len(t, fannedAt, 4)
	for _, at := range fannedAt {
		require.Equal(t, fannedAt[0], at, "the healthy events went out in one round")
	}
}

// Requeue and Discard act on what the filter selects, and only that: each
// field narrows, the zero filter takes everything poisoned, a subscriber
// leaves the events poisoned as a whole alone, and an event named that has
// nothing to act on is an error that lets the others through. Each case runs
// in a transaction of its own on one fixture, rolled back.
func TestRequeueAndDiscardByFilter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.URL(t))
	var o Outbox

	// Fanned-out events with deliveries (poisoned, or owed: "e1/audit"),
	// events poisoned as a whole ("w1", "w2"), and one that owes nothing.
	names := map[string]uuid.UUID{}
	for _, n := range []string{"e1", "e2", "e3", "w1", "w2", "ok"} {
		names[n] = uuid.Must(uuid.NewV7())
	}
	unknown := uuid.Must(uuid.NewV7())
	fixture := func(t *testing.T, tx pgx.Tx) {
		t.Helper()
		_, err := tx.Exec(ctx, `INSERT INTO outbox_events (id, type, fanned_out_at, fanout, poisoned_at, attempts, last_error) VALUES
			($1, 'note.changed', now(), '{}', NULL, 0, NULL),
			($2, 'note.deleted', now(), '{}', NULL, 0, NULL),
			($3, 'ledger.entry', now(), '{}', NULL, 0, NULL),
			($4, 'note.changed', NULL, NULL, now(), 5, 'x'),
			($5, 'ledger.entry', NULL, NULL, now(), 5, 'x'),
			($6, 'note.changed', now(), '{"search": 1}', NULL, 0, NULL)`,
			names["e1"], names["e2"], names["e3"], names["w1"], names["w2"], names["ok"])
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO outbox_deliveries (event_seq, subscriber, attempts, poisoned_at)
			SELECT e.seq, d.sub, 5, CASE WHEN d.poisoned THEN now() END
			  FROM (VALUES ($1::uuid, 'search', true), ($1, 'mail', true), ($1, 'audit', false),
			               ($2, 'search', true), ($3, 'mail', true)) AS d(id, sub, poisoned)
			  JOIN outbox_events e ON e.id = d.id`, names["e1"], names["e2"], names["e3"])
		require.NoError(t, err)
	}
	name := map[uuid.UUID]string{}
	for n, id := range names {
		name[id] = n
	}
	// poisoned lists what is poisoned: "e1/search" for a delivery, "w1" for
	// an event as a whole; rows counts the event and delivery rows.
	poisoned := func(t *testing.T, tx pgx.Tx) (list []string, rows int) {
		t.Helper()
		r, err := tx.Query(ctx, `SELECT e.id, coalesce(d.subscriber, '') FROM outbox_events e
			LEFT JOIN outbox_deliveries d ON d.event_seq = e.seq AND d.poisoned_at IS NOT NULL
			WHERE e.poisoned_at IS NOT NULL OR d.subscriber IS NOT NULL ORDER BY 1, 2`)
		require.NoError(t, err)
		var id uuid.UUID
		var sub string
		_, err = pgx.ForEachRow(r, []any{&id, &sub}, func() error {
			if sub == "" {
				list = append(list, name[id])
			} else {
				list = append(list, name[id]+"/"+sub)
			}
			return nil
		})
		require.NoError(t, err)
		require.NoError(t, tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_events) + (SELECT count(*) FROM outbox_deliveries)`).Scan(&rows))
		return list, rows
	}
	ids := func(ns ...string) []uuid.UUID {
		var out []uuid.UUID
		for _, n := range ns {
			out = append(out, names[n])
		}
		return out
	}
	everything := []string{"e1/mail", "e1/search", "e2/search", "e3/mail", "w1", "w2"}

	for _, tc := range []struct {
		name   string
		filter PoisonedFilter
		acted  []string // what it requeues or discards
		err    error    // errors.Is, for every error of the call
	}{
		{"zero: everything poisoned", PoisonedFilter{}, everything, nil},
		{"type", PoisonedFilter{Type: "note.*"}, []string{"e1/mail", "e1/search", "e2/search", "w1"}, nil},
		{"subscriber: its deliveries, no event as a whole", PoisonedFilter{Subscriber: "search"}, []string{"e1/search", "e2/search"}, nil},
		{"type and subscriber", PoisonedFilter{Type: "note.*", Subscriber: "mail"}, []string{"e1/mail"}, nil},
		{"type that matches nothing", PoisonedFilter{Type: "nothing.*"}, nil, nil},
		{"subscriber with nothing poisoned", PoisonedFilter{Subscriber: "audit"}, nil, nil},
		{"event: every poisoned delivery of it", PoisonedFilter{EventIDs: ids("e1")}, []string{"e1/mail", "e1/search"}, nil},
		{"event poisoned as a whole", PoisonedFilter{EventIDs: ids("w1")}, []string{"w1"}, nil},
		{"events", PoisonedFilter{EventIDs: ids("e1", "w2")}, []string{"e1/mail", "e1/search", "w2"}, nil},
		{"event and subscriber", PoisonedFilter{EventIDs: ids("e1"), Subscriber: "mail"}, []string{"e1/mail"}, nil},
		{"event and type", PoisonedFilter{EventIDs: ids("e1", "e2"), Type: "note.changed"}, []string{"e1/mail", "e1/search"}, ErrNotFound},
		{"event, owed but not poisoned", PoisonedFilter{EventIDs: ids("e1"), Subscriber: "audit"}, nil, ErrNotPoisoned},
		{"event that owes the subscriber nothing", PoisonedFilter{EventIDs: ids("e3"), Subscriber: "search"}, nil, ErrNotFound},
		{"event poisoned as a whole, with a subscriber", PoisonedFilter{EventIDs: ids("w1"), Subscriber: "search"}, nil, ErrNotFound},
		{"event with nothing poisoned", PoisonedFilter{EventIDs: ids("ok")}, nil, ErrNotPoisoned},
		{"unknown event: the others go on", PoisonedFilter{EventIDs: []uuid.UUID{unknown, names["e2"]}}, []string{"e2/search"}, ErrNotFound},
	} {
		for _, requeue := range []bool{true, false} {
			op, act := "Discard", o.Discard
			if requeue {
				op, act = "Requeue", o.Requeue
			}
			t.Run(op+"/"+tc.name, func(t *testing.T) {
				tx, err := pool.Begin(ctx)
				require.NoError(t, err)
				defer tx.Rollback(ctx)
				fixture(t, tx)
				_, rowsBefore := poisoned(t, tx)

				n, err := act(ctx, tx, tc.filter)
				if tc.err == nil {
					require.NoError(t, err)
				} else {
					require.ErrorIs(t, err, tc.err)
				}
				require.EqualValues(t, len(tc.acted), n)
				left, rows := poisoned(t, tx)
				var want []string
				for _, p := range everything {
					if !slices.Contains(tc.acted, p) {
						want = append(want, p)
					}
				}
				require.Equal(t, want, left)
				if requeue {
					require.Equal(t, rowsBefore, rows, "a requeue deletes nothing")
				} else {
					require.Equal(t, rowsBefore-len(tc.acted), rows, "a discard deletes what it discards")
				}
			})
		}
	}
}

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
	b.relay.eng.Hooks.AfterInsert = func(ctx context.Context, tx pgx.Tx) {
		if calls.Load() == 2 && killed.CompareAndSwap(false, true) {
			var pid int
			require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
			_, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
			require.NoError(t, err)
		}
	}
	var charged atomic.Int32
	b.relay.eng.Hooks.Charged = func(int64, int, time.Duration) { charged.Add(1) }
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
