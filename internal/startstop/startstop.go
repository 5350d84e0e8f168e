// Package startstop is the lifecycle shared by the library's background
// services, the relay and the awaiter: Start once, Ready, Stopped, and a
// graceful Stop that is bounded by its context, safe before Start and safe
// twice, and leaves no goroutine of the run behind. River's
// rivershared/startstop (BaseStartStop) is the model.
//
// A service keeps a [Base] as a field (not embedded: Start, Stop, Ready and
// Stopped are the service's to document) and hands [Base.Start] a function
// that prepares the run and adds its goroutines:
//
//   - [Run.Go] for goroutines with nothing to finish (a listener, a poller):
//     their context ends as soon as the run begins to stop;
//   - [Run.GoGraceful] for goroutines that finish what they hold (a round in
//     flight commits): their context ends only if Stop's or Start's does, so
//     they watch [Run.Stopping] and return;
//   - [Run.Drain] for what outlives the goroutines (host callbacks in line):
//     closed once they have returned, and waited for within Stop's context
//     only.
package startstop

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Start's refusals. Services map them to their own errors.
var (
	// ErrRunning: a run is active, or starting.
	ErrRunning = errors.New("startstop: a run is active")
	// ErrLingering: the last run was stopped, but what it drains (a host
	// callback that ignores its context) has not all returned.
	ErrLingering = errors.New("startstop: the last run is still draining")
)

// Base is a service's lifecycle. The zero value is a service never started
// whose run, like River's services', is over when its Start context ends: it
// may then start again without Stop.
type Base struct {
	// StopBeforeRestart keeps a run that ended with its Start context active
	// until Stop, so that Start refuses until then (the relay's: its Stop
	// releases what its Start registered).
	StopBeforeRestart bool

	// lifecycle is held through Start and through Stop: one at a time, and
	// a Start that comes during a Stop waits for it. A channel of one, so
	// that Stop waits for it within its context.
	lifecycle     chan struct{}
	lifecycleOnce sync.Once

	mu       sync.Mutex
	run      *Run // the current run, or the last one; nil before the first
	starting *Run // the run Start's function is preparing, or nil
	active   bool // run has begun and has not been stopped
}

// lock takes the lifecycle, or returns ctx's error if it ends first.
func (b *Base) lock(ctx context.Context) error {
	b.lifecycleOnce.Do(func() { b.lifecycle = make(chan struct{}, 1) })
	select {
	case b.lifecycle <- struct{}{}:
		return nil
	default:
	}
	select {
	case b.lifecycle <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *Base) unlock() { <-b.lifecycle }

// Drainer is what a run hands work to that may outlive its goroutines (a
// queue of host callbacks). Once the goroutines have returned the run calls
// Close and waits for Done; Stop calls Stop instead, which waits within its
// context and, if that ends first, returns an error saying what still runs.
type Drainer interface {
	Close()
	Done() <-chan struct{}
	Stop(ctx context.Context) error
}

// Run is one run of a service, from Start until the last of its goroutines
// (and drains) returned. Its methods are safe on a nil *Run, which is never
// stopping: work a service does outside any run.
type Run struct {
	ctx    context.Context // ends abruptly: Stop's context ended, or Start's
	cancel context.CancelFunc
	// startCtx is Start's context, ended too by a Stop that comes while
	// Start's function runs: see StartContext.
	startCtx    context.Context
	cancelStart context.CancelFunc
	// stopCtx ends when the run begins to stop; its Done is Stopping.
	stopCtx context.Context
	stop    context.CancelFunc

	ready     chan struct{}
	markReady func()

	goroutines []func(*Run)
	wg         sync.WaitGroup
	returned   chan struct{} // closed once every goroutine has returned
	drains     []Drainer
	onStop     []func()
	done       chan struct{} // closed once the drains are done too
}

// Start begins a run whose context derives from ctx: cancelling ctx ends it
// abruptly. start prepares the run and adds its goroutines, which start once
// start returns nil. If start returns an error, no run begins and Start
// returns that error; start must then have started nothing. Start returns
// ErrRunning while a run is active and ErrLingering while the last one
// drains.
//
// A Stop that comes while start runs ends the run's [Run.StartContext]:
// start should do its I/O with that context, so that it returns, and Stop
// with it.
func (b *Base) Start(ctx context.Context, start func(run *Run) error) error {
	_ = b.lock(context.Background())
	defer b.unlock()
	b.mu.Lock()
	switch {
	case b.active:
		b.mu.Unlock()
		return ErrRunning
	case b.lingering():
		b.mu.Unlock()
		return ErrLingering
	}
	run := newRun(ctx)
	b.starting = run
	b.mu.Unlock()

	err := start(run)
	run.cancelStart()
	b.mu.Lock()
	b.starting = nil
	if err == nil {
		b.run, b.active = run, true
	}
	b.mu.Unlock()
	if err != nil {
		run.stop()
		run.cancel()
		return err
	}
	run.launch(b)
	return nil
}

func newRun(ctx context.Context) *Run {
	r := &Run{ready: make(chan struct{}), returned: make(chan struct{}), done: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancel(ctx)
	r.startCtx, r.cancelStart = context.WithCancel(ctx)
	r.stopCtx, r.stop = context.WithCancel(r.ctx)
	r.markReady = sync.OnceFunc(func() { close(r.ready) })
	return r
}

// launch starts the run's goroutines and the one that follows them: once
// they have all returned it ends the run's contexts, closes the drains and
// waits for them.
func (r *Run) launch(b *Base) {
	for _, f := range r.goroutines {
		r.wg.Go(func() { f(r) })
	}
	r.goroutines = nil
	go func() {
		r.wg.Wait()
		r.stop()
		r.cancel()
		close(r.returned)
		for _, d := range r.drains {
			d.Close()
			<-d.Done()
		}
		close(r.done)
		b.ended(r)
	}()
}

// ended is called once run is over. Unless Stop must come first, a run that
// ended with its Start context is no longer active.
func (b *Base) ended(run *Run) {
	if b.StopBeforeRestart {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.run == run {
		b.active = false
	}
}

// Stop stops the active run, if any, and returns nil once its goroutines and
// drains have returned. It begins the stop (Stopping is closed, and the
// context of the Go goroutines ends) and waits for the goroutines; if ctx
// ends first it cancels the run's context, still waits for them (cancelled,
// they return promptly), and returns ctx's error. It then waits for the
// drains within ctx: a drain still running when ctx ends is left to finish
// (Stopped is closed once it has, and Start returns ErrLingering until then)
// and its error is returned. Last, the functions given to OnStop run. Safe
// before Start and safe twice.
//
// A Stop that comes while Start prepares a run ends that run's
// StartContext, then waits for Start within ctx: ctx's error if Start has
// not returned by then.
func (b *Base) Stop(ctx context.Context) error {
	b.mu.Lock()
	if b.starting != nil {
		b.starting.cancelStart()
	}
	b.mu.Unlock()
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.unlock()
	run := b.Current()
	if run == nil {
		return nil
	}
	run.stop()
	var err error
	select {
	case <-run.returned:
	case <-ctx.Done():
		err = ctx.Err()
		run.cancel()
		<-run.returned
	}
	drained := true
	for _, d := range run.drains {
		if dErr := d.Stop(ctx); dErr != nil {
			err, drained = dErr, false
		}
	}
	if drained {
		<-run.done
	}
	for _, f := range run.onStop {
		f()
	}
	b.mu.Lock()
	b.active = false
	b.mu.Unlock()
	return err
}

// Current returns the active run, or nil.
func (b *Base) Current() *Run {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.active {
		return nil
	}
	return b.run
}

// Active reports whether a run is active or starting: Start refuses.
func (b *Base) Active() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.active || b.starting != nil
}

// Running reports whether a run is active and its goroutines, drains aside,
// have not all returned.
func (b *Base) Running() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.active && !isClosed(b.run.returned)
}

// Lingering reports whether the last run was stopped and still drains.
func (b *Base) Lingering() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lingering()
}

func (b *Base) lingering() bool {
	return !b.active && b.run != nil && !isClosed(b.run.done)
}

// Ready returns the channel that the current run (or the last) closes with
// MarkReady. Before the first Start it returns a channel that is never
// closed.
func (b *Base) Ready() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.run == nil {
		return make(chan struct{})
	}
	return b.run.ready
}

// Stopped returns a channel that is closed once the current run (or the
// last) is over: its goroutines and its drains have returned. Before the
// first Start it returns a closed channel.
func (b *Base) Stopped() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.run == nil {
		return closed
	}
	return b.run.done
}

var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// StartContext is the context for the I/O of Start's function (a service
// registering itself, say): Start's context, ended too once Start's
// function has returned or a Stop has come meanwhile.
func (r *Run) StartContext() context.Context { return r.startCtx }

// Go adds a goroutine to the run, started when Start's function returns nil
// (call Go from there). Its context ends as soon as the run begins to stop.
func (r *Run) Go(f func(ctx context.Context)) {
	r.goroutines = append(r.goroutines, func(r *Run) { f(r.stopCtx) })
}

// GoGraceful is Go for a goroutine that finishes what it holds when the run
// stops: its context ends only when the run's does (Stop's context ended, or
// Start's), so it must return on its own once Stopping is closed.
func (r *Run) GoGraceful(f func(ctx context.Context)) {
	r.goroutines = append(r.goroutines, func(r *Run) { f(r.ctx) })
}

// Drain has the run close d and wait for it once its goroutines have
// returned (see [Drainer]). Call it from Start's function.
func (r *Run) Drain(d Drainer) { r.drains = append(r.drains, d) }

// OnStop has Stop call f last, before a new run may start: to release what
// Start's function registered. Call it from Start's function.
func (r *Run) OnStop(f func()) { r.onStop = append(r.onStop, f) }

// MarkReady closes the run's Ready channel; later calls do nothing.
func (r *Run) MarkReady() {
	if r != nil {
		r.markReady()
	}
}

// Stopping returns a channel that is closed once the run begins to stop:
// Stop was called, or Start's context ended. Nil (never closed) for a nil
// run.
func (r *Run) Stopping() <-chan struct{} {
	if r == nil {
		return nil
	}
	return r.stopCtx.Done()
}

// IsStopping reports whether Stopping is closed.
func (r *Run) IsStopping() bool { return r != nil && r.stopCtx.Err() != nil }

// Every calls f after first, then again interval after each call returned,
// until stopping is closed or ctx ends.
func Every(ctx context.Context, stopping <-chan struct{}, first, interval time.Duration, f func()) {
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-stopping:
			return
		case <-ctx.Done():
			return
		}
		f()
		t.Reset(interval)
	}
}
