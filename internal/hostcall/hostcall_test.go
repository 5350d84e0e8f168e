package hostcall

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// A Stop that gives up names the callback still running; Done is closed once
// it has returned.
func TestStopThatGivesUpNamesTheRunningCall(t *testing.T) {
	t.Parallel()
	r := Start(context.Background(), quiet(), 10)
	started, release := make(chan struct{}), make(chan struct{})
	require.True(t, r.Go("OnPoison", []slog.Attr{slog.String("event_id", "e1"), slog.String("err", "x")}, func(context.Context) {
		close(started)
		<-release // ignores its context
	}))
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := r.Stop(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.EqualError(t, err, "events: OnPoison still running (event_id=e1): context deadline exceeded")
	select {
	case <-r.Done():
		t.Fatal("Done while a callback runs")
	default:
	}
	require.False(t, r.Go("OnPoison", nil, func(context.Context) {}), "closed")
	close(release)
	<-r.Done()
	require.NoError(t, r.Stop(ctx), "nothing runs: nil even with an ended context")
}

// Close lets the queued callbacks run, with a live context.
func TestCloseRunsTheQueue(t *testing.T) {
	t.Parallel()
	r := Start(context.Background(), quiet(), 10)
	var ran []int
	for i := range 3 {
		require.True(t, r.Go("f", nil, func(ctx context.Context) {
			require.NoError(t, ctx.Err())
			ran = append(ran, i)
		}))
	}
	r.Close()
	r.Close()
	<-r.Done()
	require.Equal(t, []int{0, 1, 2}, ran)
	require.NoError(t, r.Stop(context.Background()))
}
