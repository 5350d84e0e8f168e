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
	for cfg, field := range map[*RelayConfig]string{
		{BatchSize: -1}:                                           "BatchSize",
		{MaxAttempts: -1}:                                         "MaxAttempts",
		{RetryBackoff: -time.Second}:                              "RetryBackoff",
		{RetryBackoff: 2 * time.Minute}:                           "MaxRetryBackoff",
		{Listener: ListenerConfig{ReconnectBackoff: -1}}:          "Listener.ReconnectBackoff",
		{Listener: ListenerConfig{ReconnectBackoff: time.Minute}}: "Listener.MaxReconnectBackoff",
	} {
		_, err = NewRelay(b.pool, cfg)
		var ve *ValidationError
		require.ErrorAs(t, err, &ve)
		require.ErrorIs(t, err, ErrInvalidConfig)
		require.Equal(t, field, ve.Field, "%v", err)
	}
	for cfg, field := range map[*AwaiterConfig]string{
		{NotFoundGrace: -1}:                                       "NotFoundGrace",
		{Outbox: Outbox{Schema: "a-b"}}:                           "Outbox.Schema",
		{Listener: ListenerConfig{ReconnectBackoff: time.Minute}}: "Listener.MaxReconnectBackoff",
	} {
		_, err = NewAwaiter(b.pool, cfg)
		var ve *ValidationError
		require.ErrorAs(t, err, &ve)
		require.Equal(t, field, ve.Field, "%v", err)
	}

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
		var ve *ValidationError
		require.ErrorAs(t, err, &ve)
		require.Equal(t, tt.field, ve.Field)
	}
	require.NoError(t, b.relay.Subscribe(Subscriber{Name: "x", Types: []string{"a"}, Handle: noopHandle}))
	require.ErrorIs(t, b.relay.Subscribe(Subscriber{Name: "x", Types: []string{"a"}, Handle: noopHandle}), ErrInvalidSubscriber)
}

func noopHandle(context.Context, Event) error { return nil }

// Relay and Awaiter share one lifecycle: Ready once listening (the relay:
// and caught up), Stopped once stopped, Stop bounded by its context in both.
func TestRelayAndAwaiterLifecycleSignals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	a, err := NewAwaiter(b.pool, &AwaiterConfig{Logger: quietLogger()})
	require.NoError(t, err)
	for _, stopped := range []<-chan struct{}{b.relay.Stopped(), a.Stopped()} {
		requireClosed(t, stopped, "Stopped before Start")
	}
	e := b.record(t, Event{Type: "before.start"})[0]
	require.NoError(t, b.relay.Start(ctx, b.client))
	require.NoError(t, a.Start(ctx))
	requireClosed(t, b.relay.Ready(), "relay Ready")
	requireClosed(t, a.Ready(), "awaiter Ready")
	require.True(t, loadRows(t, b.pool)[e.ID].FannedOut, "ready means caught up with what was there")
	select {
	case <-b.relay.Stopped():
		t.Fatal("Stopped while running")
	case <-a.Stopped():
		t.Fatal("Stopped while running")
	default:
	}

	// Stop with an expired context: both cancel and return its error.
	expired, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, b.relay.Stop(expired), context.Canceled)
	require.ErrorIs(t, a.Stop(expired), context.Canceled)
	requireClosed(t, b.relay.Stopped(), "relay Stopped")
	requireClosed(t, a.Stopped(), "awaiter Stopped")
	require.NoError(t, b.relay.Stop(ctx))
	require.NoError(t, a.Stop(ctx))

	// A cancelled Start context stops the relay too.
	runCtx, cancelRun := context.WithCancel(ctx)
	require.NoError(t, b.relay.Start(runCtx, b.client))
	cancelRun()
	requireClosed(t, b.relay.Stopped(), "relay Stopped after its Start context ended")
	require.NoError(t, b.relay.Stop(ctx))
}

func requireClosed(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: never closed", what)
	}
}
