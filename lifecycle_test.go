package events

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestStopIsSafeBeforeStartAndTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	require.NoError(t, b.relay.Stop(ctx))
	require.NoError(t, b.relay.Start(ctx, b.client))
	require.ErrorIs(t, b.relay.Start(ctx, b.client), ErrStarted)
	require.ErrorIs(t, b.relay.Subscribe(mapSub("late", false, "**")), ErrStarted)
	require.NoError(t, b.relay.Stop(ctx))
	require.NoError(t, b.relay.Stop(ctx))
	// And it starts again.
	require.NoError(t, b.relay.Start(ctx, b.client))
	e := b.record(t, Event{Type: "a"})[0]
	require.Eventually(t, func() bool { return loadRows(t, b.pool)[e.ID].FannedOut }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, b.relay.Stop(ctx))
}

// Stop lets the round in flight finish: it commits, it is not cut short.
func TestStopLetsTheRoundInFlightCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	inRound := make(chan struct{})
	release := make(chan struct{})
	b.relay.hooks.afterInsert = func(context.Context, pgx.Tx) {
		close(inRound)
		<-release
	}
	b.record(t, Event{Type: "a"}, Event{Type: "b"})
	require.NoError(t, b.relay.Start(ctx, b.client))
	<-inRound
	stopped := make(chan error)
	go func() { stopped <- b.relay.Stop(ctx) }()
	select {
	case <-stopped:
		t.Fatal("Stop returned while a round was in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	require.NoError(t, <-stopped)
	for _, r := range loadRows(t, b.pool) {
		require.True(t, r.FannedOut)
	}
}

// When Stop's context ends first, the round is cancelled and rolls back.
func TestStopWithAnExpiredContextCancelsTheRound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	inRound := make(chan struct{})
	b.relay.hooks.afterInsert = func(ctx context.Context, _ pgx.Tx) {
		close(inRound)
		<-ctx.Done()
	}
	b.record(t, Event{Type: "a"})
	require.NoError(t, b.relay.Start(ctx, b.client))
	<-inRound
	stopCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, b.relay.Stop(stopCtx), context.DeadlineExceeded)
	for _, r := range loadRows(t, b.pool) {
		require.False(t, r.FannedOut)
	}
	require.Empty(t, loadJobs(t, b.pool))
}

func TestConfigAndSubscriberErrorsNameTheField(t *testing.T) {
	t.Parallel()
	_, err := NewRelay(nil, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
	b := setup(t, setupOpts{})
	_, err = NewRelay(b.pool, &Config{BatchSize: -1})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.Contains(t, err.Error(), "BatchSize")

	for _, tt := range []struct {
		sub   Subscriber
		field string
	}{
		{Subscriber{Name: "", Types: []string{"a"}, Handle: noopHandle}, "Name"},
		{Subscriber{Name: "Has Space", Types: []string{"a"}, Handle: noopHandle}, "Name"},
		{Subscriber{Name: "x", Handle: noopHandle}, "Types"},
		{Subscriber{Name: "x", Types: []string{"a.b*"}, Handle: noopHandle}, "Types"},
		{Subscriber{Name: "x", Types: []string{"a"}}, "Map/Handle"},
		{Subscriber{Name: "x", Types: []string{"a"}, Handle: noopHandle, Map: mapSub("y", false, "a").Map}, "Map/Handle"},
	} {
		err := b.relay.Subscribe(tt.sub)
		require.ErrorIs(t, err, ErrInvalidSubscriber)
		require.Contains(t, err.Error(), tt.field)
	}
	require.NoError(t, b.relay.Subscribe(Subscriber{Name: "x", Types: []string{"a"}, Handle: noopHandle}))
	require.ErrorIs(t, b.relay.Subscribe(Subscriber{Name: "x", Types: []string{"a"}, Handle: noopHandle}), ErrInvalidSubscriber)
}

func noopHandle(context.Context, Event) error { return nil }
