package events

import (
	"context"
	"log/slog"
)

// The catch-up lane. A relay that stamps an event writes in its catch_up
// column the registered subscribers it does not know (registry.go); a relay
// that knows one of them claims such rows here, FOR UPDATE SKIP LOCKED like
// any round, inserts the jobs of the subscribers it knows and that match,
// extends the event's fanout and removes its names from catch_up, all in one
// transaction. So each event is examined once more per relay subscriber set
// that lacked a subscriber, and never again: the lane is read through a GIN
// index on catch_up, so rows waiting only for a subscriber that no running
// relay knows are never read (until RetireSubscriber clears them).
//
// Failures are handled as in the pending lane: a batch refused as a whole is
// retried row by row, an event whose mapping fails is charged an attempt,
// waits for next_attempt_at, and is poisoned after MaxAttempts (Requeue puts
// it back in this lane, since catch_up is kept).

// catchUpOrFail runs the catch-up lane until it has nothing more for this
// relay. On a failed round it backs off with fail and retries the claimed
// rows one by one. It reports whether the loop should go on.
func (r *Relay) catchUpOrFail(ctx context.Context, fail func(error) bool) bool {
	if len(r.known) == 0 {
		return true
	}
	for !r.stopping() && ctx.Err() == nil {
		claimed, err := r.round(ctx, laneCatchUp, r.sql.ClaimCatchUp, r.known, int64(r.config.BatchSize))
		if err != nil {
			if r.stopping() || ctx.Err() != nil || !fail(err) {
				return false
			}
			if err := r.rowByRow(ctx, laneCatchUp, claimed); err != nil && ctx.Err() == nil {
				r.logger.WarnContext(ctx, "events: row-by-row catch-up interrupted", slog.String("err", err.Error()))
			}
			return true
		}
		if len(claimed) < r.config.BatchSize {
			return true
		}
	}
	return false
}
