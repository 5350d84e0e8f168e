// Package notifylimit decides which writing transactions send the relays'
// notification. A transaction that has run pg_notify takes a cluster-wide
// lock at commit (PreCommit_Notify in PostgreSQL's async.c) and holds it
// through its WAL flush, so notifying in every transaction serialises every
// notifying commit of the cluster. River throttles its insert notifications
// the same way (its notifylimiter).
package notifylimit

import (
	"sync"
	"sync/atomic"
	"time"
)

// Limiter lets at most one caller per interval through. The zero value is
// ready.
type Limiter struct {
	last    atomic.Int64 // nanoseconds since epoch (monotonic) of the last pass
	refused atomic.Int64 // and of the last refusal
}

// epoch anchors the monotonic clock readings.
var epoch = time.Now()

// Allow reports whether the caller should notify: interval < 0 never, 0
// always, otherwise when interval has passed since the last caller that was
// allowed. Callers that lose a race for the same slot are refused.
func (l *Limiter) Allow(interval time.Duration) bool {
	if interval == 0 {
		return true
	}
	now := max(int64(time.Since(epoch)), 1)
	last := l.last.Load()
	if interval > 0 && (last == 0 || now-last >= int64(interval)) && l.last.CompareAndSwap(last, now) {
		return true
	}
	// Stored at most about once per refusalGrain: refusals are most calls
	// under load, and a store per call would bounce the cache line every
	// caller reads last from.
	if now-l.refused.Load() >= int64(refusalGrain) {
		l.refused.Store(now)
	}
	return false
}

// refusalGrain is how stale the time of the last refusal may be.
const refusalGrain = time.Millisecond

// RefusedWithin reports whether a caller was refused in the last d (to
// within refusalGrain): some transaction of this process may have committed
// without notifying.
func (l *Limiter) RefusedWithin(d time.Duration) bool {
	refused := l.refused.Load()
	return refused != 0 && int64(time.Since(epoch))-refused < int64(d)
}

var limiters sync.Map // key (a schema) -> *Limiter

// For returns the process's limiter for key.
func For(key string) *Limiter {
	if l, ok := limiters.Load(key); ok {
		return l.(*Limiter)
	}
	l, _ := limiters.LoadOrStore(key, new(Limiter))
	return l.(*Limiter)
}
