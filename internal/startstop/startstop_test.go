package startstop

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// drain is a Drainer whose work returns when release is closed.
type drain struct {
	closed  atomic.Bool
	release chan struct{}
	done    chan struct{}
}

func newDrain() *drain {
	d := &drain{release: make(chan struct{}), done: make(chan struct{})}
	go func() { <-d.release; close(d.done) }()
	return d
}

func (d *drain) Close()                { d.closed.Store(true) }
func (d *drain) Done() <-chan struct{} { return d.done }
func (d *drain) Stop(ctx context.Context) error {
	d.Close()
	select {
	case <-d.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("still draining: %w", ctx.Err())
	}
}

func requireClosed(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: never closed", what)
	}
}

func requireOpen(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
		t.Fatalf("%s: closed", what)
	default:
	}
}

func TestStopIsSafeBeforeStartAndTwice(t *testing.T) {
	t.Parallel()
	var b Base
	requireClosed(t, b.Stopped(), "Stopped before Start")
	requireOpen(t, b.Ready(), "Ready before Start")
	require.NoError(t, b.Stop(context.Background()))
	require.NoError(t, b.Start(context.Background(), func(run *Run) error {
		run.Go(func(ctx context.Context) { <-ctx.Done() })
		return nil
	}))
	require.ErrorIs(t, b.Start(context.Background(), func(*Run) error { return nil }), ErrRunning)
	require.True(t, b.Active())
	require.True(t, b.Running())
	require.NoError(t, b.Stop(context.Background()))
	require.NoError(t, b.Stop(context.Background()))
	requireClosed(t, b.Stopped(), "Stopped after Stop")
	require.False(t, b.Active())
	require.False(t, b.Running())
}

// A Start whose function fails begins no run: the last run's channels stay,
// and Start works again.
func TestAFailedStartBeginsNoRun(t *testing.T) {
	t.Parallel()
	var b Base
	boom := errors.New("boom")
	require.ErrorIs(t, b.Start(context.Background(), func(run *Run) error {
		run.Go(func(context.Context) { t.Error("a goroutine of a failed start ran") })
		return boom
	}), boom)
	require.False(t, b.Active())
	require.Nil(t, b.Current())
	requireClosed(t, b.Stopped(), "Stopped, as before the first Start")
	require.NoError(t, b.Start(context.Background(), func(*Run) error { return nil }))
	require.NoError(t, b.Stop(context.Background()))
}

// Go goroutines end when the stop begins; GoGraceful ones finish what they
// hold with their context intact, unless Stop's context ends first.
func TestGracefulGoroutinesFinishWithTheirContext(t *testing.T) {
	t.Parallel()
	var b Base
	holding, release := make(chan struct{}), make(chan struct{})
	var finishedWith atomic.Value
	require.NoError(t, b.Start(context.Background(), func(run *Run) error {
		run.Go(func(ctx context.Context) { <-ctx.Done() })
		run.GoGraceful(func(ctx context.Context) {
			close(holding)
			<-release
			finishedWith.Store(fmt.Sprint(ctx.Err()))
			<-run.Stopping()
		})
		return nil
	}))
	<-holding
	stopped := make(chan error)
	go func() { stopped <- b.Stop(context.Background()) }()
	require.Eventually(t, func() bool { return b.Current().IsStopping() }, 30*time.Second, time.Millisecond)
	select {
	case <-stopped:
		t.Fatal("Stop returned while a graceful goroutine held its work")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	require.NoError(t, <-stopped)
	require.Equal(t, "<nil>", finishedWith.Load(), "the graceful goroutine's context was cancelled")
}

func TestStopWithAnExpiredContextCancelsTheRun(t *testing.T) {
	t.Parallel()
	var b Base
	require.NoError(t, b.Start(context.Background(), func(run *Run) error {
		run.GoGraceful(func(ctx context.Context) { <-ctx.Done() }) // ignores Stopping
		return nil
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, b.Stop(ctx), context.DeadlineExceeded)
	requireClosed(t, b.Stopped(), "Stopped")
}

// A drain that outlives Stop's context: Stop names it, Stopped waits for it,
// Start refuses until then, and OnStop ran.
func TestADrainThatOutlivesStop(t *testing.T) {
	t.Parallel()
	var b Base
	d := newDrain()
	var onStop atomic.Int32
	require.NoError(t, b.Start(context.Background(), func(run *Run) error {
		run.Drain(d)
		run.OnStop(func() { onStop.Add(1) })
		return nil
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	require.ErrorContains(t, b.Stop(ctx), "still draining")
	require.Equal(t, int32(1), onStop.Load())
	require.False(t, b.Running())
	require.True(t, b.Lingering())
	requireOpen(t, b.Stopped(), "Stopped while draining")
	require.ErrorIs(t, b.Start(context.Background(), func(*Run) error { return nil }), ErrLingering)

	close(d.release)
	requireClosed(t, b.Stopped(), "Stopped once drained")
	require.False(t, b.Lingering())
	require.NoError(t, b.Stop(context.Background()), "nothing left to stop")
	require.NoError(t, b.Start(context.Background(), func(*Run) error { return nil }))
	require.NoError(t, b.Stop(context.Background()))
}

// A run ends with its Start context: by default it may start again at once;
// with StopBeforeRestart, only after Stop.
func TestARunEndsWithItsStartContext(t *testing.T) {
	t.Parallel()
	for _, stopFirst := range []bool{false, true} {
		b := &Base{StopBeforeRestart: stopFirst}
		d := newDrain()
		close(d.release)
		ctx, cancel := context.WithCancel(context.Background())
		require.NoError(t, b.Start(ctx, func(run *Run) error {
			run.Go(func(ctx context.Context) { <-ctx.Done() })
			run.Drain(d)
			return nil
		}))
		run := b.Current()
		cancel()
		requireClosed(t, run.Stopping(), "Stopping once Start's context ended")
		requireClosed(t, b.Stopped(), "Stopped once Start's context ended")
		require.True(t, d.closed.Load(), "the drain was closed")
		require.False(t, b.Running())
		if stopFirst {
			require.ErrorIs(t, b.Start(context.Background(), func(*Run) error { return nil }), ErrRunning)
			require.NoError(t, b.Stop(context.Background()))
		} else {
			require.Eventually(t, func() bool { return !b.Active() }, 30*time.Second, time.Millisecond)
		}
		require.NoError(t, b.Start(context.Background(), func(*Run) error { return nil }))
		require.NoError(t, b.Stop(context.Background()))
	}
}

// Ready belongs to a run: a new run has a new one.
func TestReadyIsPerRun(t *testing.T) {
	t.Parallel()
	var b Base
	require.NoError(t, b.Start(context.Background(), func(run *Run) error {
		run.MarkReady()
		run.MarkReady() // twice is fine
		return nil
	}))
	requireClosed(t, b.Ready(), "Ready")
	require.NoError(t, b.Stop(context.Background()))
	requireClosed(t, b.Ready(), "Ready of the last run, after Stop")
	require.NoError(t, b.Start(context.Background(), func(*Run) error { return nil }))
	requireOpen(t, b.Ready(), "Ready of a run that never marked it")
	require.NoError(t, b.Stop(context.Background()))
}

func TestANilRunNeverStops(t *testing.T) {
	t.Parallel()
	var run *Run
	require.False(t, run.IsStopping())
	require.Nil(t, run.Stopping())
	run.MarkReady()
}

func TestEvery(t *testing.T) {
	t.Parallel()
	stopping := make(chan struct{})
	calls := make(chan struct{}, 10)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		Every(context.Background(), stopping, 0, time.Millisecond, func() {
			select {
			case calls <- struct{}{}:
			default:
			}
		})
	}()
	for range 3 {
		<-calls
	}
	close(stopping)
	requireClosed(t, returned, "Every after stopping")
}

// A Stop that comes while Start's function runs ends its StartContext and
// returns once Start has; a Start function that ignores it leaves Stop
// bounded by Stop's own context.
func TestStopDuringStart(t *testing.T) {
	t.Parallel()
	var b Base
	inStart := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		started <- b.Start(context.Background(), func(run *Run) error {
			close(inStart)
			<-run.StartContext().Done()
			return run.StartContext().Err()
		})
	}()
	<-inStart
	require.NoError(t, b.Stop(context.Background()))
	require.ErrorIs(t, <-started, context.Canceled)
	require.False(t, b.Active())

	release := make(chan struct{})
	inStart = make(chan struct{})
	go func() {
		started <- b.Start(context.Background(), func(*Run) error {
			close(inStart)
			<-release
			return nil
		})
	}()
	<-inStart
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, b.Stop(ctx), context.DeadlineExceeded)
	close(release)
	require.NoError(t, <-started)
	require.NoError(t, b.Stop(context.Background()), "the run that began after all is stopped")
	require.False(t, b.Active())
}
