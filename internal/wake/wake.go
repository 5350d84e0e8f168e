// Package wake is a wake-up that coalesces: any number of sends while the
// receiver is busy leave one wake-up pending, and a send never blocks. The
// relay's loops, the listener's callbacks and the awaiter's waiters wake
// each other with it.
package wake

// Signal is received from like a channel (case <-s:). Make it with New.
type Signal chan struct{}

// New returns a signal with no wake-up pending.
func New() Signal { return make(Signal, 1) }

// Send leaves a wake-up pending, unless one already is: that one covers
// this one too.
func (s Signal) Send() {
	select {
	case s <- struct{}{}:
	default:
	}
}

// Clear drops the pending wake-up, if any.
func (s Signal) Clear() {
	select {
	case <-s:
	default:
	}
}
