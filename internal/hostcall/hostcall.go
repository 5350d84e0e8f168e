// Package hostcall runs host callbacks off the path that serves every other
// event: on a goroutine of their own, one at a time, panics recovered and
// logged, behind a bounded queue.
package hostcall

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
)

// Runner runs queued callbacks in order. The zero value is not usable; call
// Start.
type Runner struct {
	logger *slog.Logger
	queue  chan call
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	closed  bool
	current *call // the callback running now, for Stop's error
}

type call struct {
	name  string
	attrs []slog.Attr
	f     func(ctx context.Context)
}

// Start starts a runner whose queue holds up to capacity callbacks. The
// callbacks' context is ctx without its cancellation: it ends only when Stop
// gives up waiting.
func Start(ctx context.Context, logger *slog.Logger, capacity int) *Runner {
	r := &Runner{logger: logger, queue: make(chan call, capacity), done: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))
	go r.run()
	return r
}

// Go queues f. It never blocks: when the queue is full (callbacks slower
// than what feeds them), or after Close or Stop, f is dropped, an error is
// logged with attrs, and Go reports false. attrs describe the call, the first
// saying what it is about (an event's ID): Stop's error names a call still
// running by name and that attribute.
func (r *Runner) Go(name string, attrs []slog.Attr, f func(ctx context.Context)) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		select {
		case r.queue <- call{name, attrs, f}:
			return true
		default:
		}
	}
	r.logger.LogAttrs(r.ctx, slog.LevelError, fmt.Sprintf("events: %s not called: %d callbacks already queued, or stopping", name, cap(r.queue)), attrs...)
	return false
}

func (r *Runner) run() {
	defer close(r.done)
	for c := range r.queue {
		r.safely(c)
	}
}

func (r *Runner) safely(c call) {
	r.mu.Lock()
	r.current = &c
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.current = nil
		r.mu.Unlock()
	}()
	defer func() {
		if p := recover(); p != nil {
			attrs := append(c.attrs[:len(c.attrs):len(c.attrs)], slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			r.logger.LogAttrs(r.ctx, slog.LevelError, "events: "+c.name+" panicked", attrs...)
		}
	}()
	c.f(r.ctx)
}

// Close refuses new callbacks; the queued ones still run, and Done is
// closed once they have. Safe to call twice.
func (r *Runner) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.closed = true
		close(r.queue)
	}
}

// Done returns a channel that is closed once r is closed and the last
// callback has returned: from then on no goroutine of r is left.
func (r *Runner) Done() <-chan struct{} { return r.done }

// Stop closes r and waits for the queued callbacks to run. If ctx ends
// first, the callbacks' context is cancelled and Stop returns, without
// waiting further, an error that wraps ctx's error and names the callback
// still running (or how many are still queued); that callback then finishes
// on its own, and the rest of the queue is called with the cancelled context.
// Done tells when they have. Safe to call twice.
func (r *Runner) Stop(ctx context.Context) error {
	r.Close()
	select {
	case <-r.done: // even if ctx has ended: nothing runs
	default:
		select {
		case <-r.done:
		case <-ctx.Done():
			r.cancel()
			return r.stillRunning(ctx.Err())
		}
	}
	r.cancel()
	return nil
}

// stillRunning is Stop's error when it gives up waiting.
func (r *Runner) stillRunning(err error) error {
	r.mu.Lock()
	c := r.current
	r.mu.Unlock()
	if c == nil {
		return fmt.Errorf("events: %d callbacks still queued: %w", len(r.queue), err)
	}
	if len(c.attrs) == 0 {
		return fmt.Errorf("events: %s still running: %w", c.name, err)
	}
	return fmt.Errorf("events: %s still running (%s): %w", c.name, c.attrs[0], err)
}
