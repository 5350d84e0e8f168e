// Package backoff computes capped exponential delays.
package backoff

import "time"

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
