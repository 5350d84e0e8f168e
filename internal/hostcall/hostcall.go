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

	mu     sync.Mutex
	closed bool
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
// than what feeds them), or after Stop, f is dropped, an error is logged with
// attrs, and Go reports false.
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
	defer func() {
		if p := recover(); p != nil {
			attrs := append(c.attrs[:len(c.attrs):len(c.attrs)], slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			r.logger.LogAttrs(r.ctx, slog.LevelError, "events: "+c.name+" panicked", attrs...)
		}
	}()
	c.f(r.ctx)
}

// Stop refuses new callbacks and waits for the queued ones to run. If ctx
// ends first, the callbacks' context is cancelled and Stop returns ctx's
// error without waiting further; a callback that ignores its context then
// finishes on its own. Safe to call twice.
func (r *Runner) Stop(ctx context.Context) error {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.queue)
	}
	r.mu.Unlock()
	select {
	case <-r.done:
		r.cancel()
		return nil
	case <-ctx.Done():
		r.cancel()
		return ctx.Err()
	}
}
