// Package backoff computes capped exponential delays, and waits them out.
package backoff

import (
	"context"
	"time"
)

// Delay returns the pause before the given attempt (1-based): first, doubling
// with every attempt, never more than max.
func Delay(attempt int, first, max time.Duration) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := first
	for i := 1; i < attempt; i++ {
		if d >= max/2 {
			return max
		}
		d *= 2
	}
	if d > max {
		return max
	}
	return d
}

// Sleep waits d, or until ctx ends: then it returns ctx's error.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
