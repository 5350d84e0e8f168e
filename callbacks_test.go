package events

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"
)

// poisonAtOnce is a relay config that poisons an event at its first failure.
func poisonAtOnce(onPoison func(context.Context, Event, error)) *RelayConfig {
	return &RelayConfig{MaxAttempts: 1, OnPoison: onPoison}
}

// failingSub fails the mapping of events of type "bad" and maps the others.
func failingSub() Subscriber {
	return Subscriber{Name: "mailer", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			if e.Type == "bad" {
				return nil, nil, errors.New("no template")
			}
			return testArgs{EventID: e.ID}, nil, nil
		}}
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
	require.Eventually(t, func() bool { return loadRows(t, b.pool)[good.ID].FannedOut }, 10*time.Second, 5*time.Millisecond)
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

// Stop waits for the OnPoison calls in line when its context allows.
func TestStopWaitsForOnPoison(t *testing.T) {
	t.Parallel()
	started, finished := make(chan struct{}), make(chan struct{})
	b := setup(t, setupOpts{config: poisonAtOnce(func(context.Context, Event, error) {
		close(started)
		time.Sleep(100 * time.Millisecond) // a callback that takes a while
		close(finished)
	})}, failingSub())
	b.start(t)
	b.record(t, Event{Type: "bad"})
	<-started
	require.NoError(t, b.relay.Stop(context.Background()))
	select {
	case <-finished:
	default:
		t.Fatal("Stop returned before OnPoison finished")
	}
}

// Once the relay is stopping, the round calls no more host code: a mapper
// that ignores its context is not called again after Stop's context ended.
func TestStoppingStopsCallingMap(t *testing.T) {
	t.Parallel()
	calls := make(chan struct{}, 1000)
	release := make(chan struct{})
	b := setup(t, setupOpts{config: &RelayConfig{BatchSize: 500}}, Subscriber{Name: "slow", Types: []string{"**"},
		Map: func(context.Context, Event) (river.JobArgs, *river.InsertOpts, error) {
			calls <- struct{}{}
			<-release // ignores its context
			return testArgs{}, nil, nil
		}})
	es := make([]Event, 300)
	for i := range es {
		es[i] = Event{Type: "a"}
	}
	b.record(t, es...)
	require.NoError(t, b.relay.Start(context.Background(), b.client))
	<-calls
	stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	stopped := make(chan error)
	go func() { stopped <- b.relay.Stop(stopCtx) }()
	<-stopCtx.Done()
	close(release) // the first Map returns, long after Stop's deadline
	require.ErrorIs(t, <-stopped, context.DeadlineExceeded)
	require.Empty(t, calls, "Map was called again after the relay was stopping")
	for _, r := range loadRows(t, b.pool) {
		require.False(t, r.FannedOut)
		require.Zero(t, r.Attempts, "a stop is charged to no event")
	}
}

// Stop does not wait past its context for an OnPoison that ignores it, but
// says so: its error names the call still running, Stopped stays open until
// the call returns, and a new run (which would call OnPoison alongside it)
// is refused until then.
func TestStopThatGivesUpNamesTheOnPoisonStillRunning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	started, release := make(chan struct{}), make(chan struct{})
	b := setup(t, setupOpts{config: poisonAtOnce(func(context.Context, Event, error) {
		close(started)
		<-release // ignores its context
	})}, failingSub())
	require.NoError(t, b.relay.Start(ctx, b.client))
	bad := b.record(t, Event{Type: "bad"})[0]
	<-started

	stopCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	err := b.relay.Stop(stopCtx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "OnPoison still running")
	require.ErrorContains(t, err, bad.ID.String())
	select {
	case <-b.relay.Stopped():
		t.Fatal("Stopped was closed while OnPoison was still running")
	default:
	}
	require.False(t, b.relay.Health().Running, "the relay serves no events")
	require.ErrorIs(t, b.relay.Start(ctx, b.client), ErrStarted)
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = b.relay.FanOutTx(ctx, tx, b.client)
	require.ErrorIs(t, err, ErrStarted)
	require.NoError(t, tx.Rollback(ctx))

	close(release)
	requireClosed(t, b.relay.Stopped(), "Stopped once OnPoison returned")
	require.NoError(t, b.relay.Stop(ctx))
	require.NoError(t, b.relay.Start(ctx, b.client), "it starts again")
	require.NoError(t, b.relay.Stop(ctx))
}

// A relay stopped by its Start context (no Stop) still lets the OnPoison
// calls in line run, and Stopped waits for them.
func TestStoppedWaitsForOnPoisonAfterStartContextEnds(t *testing.T) {
	t.Parallel()
	started, release, returned := make(chan struct{}), make(chan struct{}), make(chan struct{})
	b := setup(t, setupOpts{config: poisonAtOnce(func(context.Context, Event, error) {
		close(started)
		<-release
		close(returned)
	})}, failingSub())
	runCtx, cancelRun := context.WithCancel(context.Background())
	require.NoError(t, b.relay.Start(runCtx, b.client))
	b.record(t, Event{Type: "bad"})
	<-started
	cancelRun()
	require.Eventually(t, func() bool { return !b.relay.Health().Running }, 10*time.Second, time.Millisecond)
	select {
	case <-b.relay.Stopped():
		t.Fatal("Stopped was closed while OnPoison was still running")
	default:
	}
	close(release)
	requireClosed(t, b.relay.Stopped(), "Stopped once OnPoison returned")
	select {
	case <-returned:
	default:
		t.Fatal("Stopped was closed before OnPoison returned")
	}
	require.NoError(t, b.relay.Stop(context.Background()))
}
