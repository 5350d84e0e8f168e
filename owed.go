package events

import (
	"context"
	"log/slog"
	"time"
)

// The deliveries lane. An (event, subscriber) pair is owed when its
// subscriber's attempt failed (it waits for its retry, or is poisoned), when
// the relay that stamped the event did not know the subscriber (a rolling
// deploy: the stamp writes a pair for every active registered subscriber it
// lacks whose types match), or when the subscriber was paused. Only owed
// pairs have a row, in outbox_deliveries; the common path writes none.
//
// A relay claims the due pairs of the subscribers it knows here, FOR UPDATE
// SKIP LOCKED with their events, inserts their jobs, extends the events'
// fanout and deletes the pairs, all in one transaction: exactly once per
// pair. A pair that fails again is charged and waits for its next attempt;
// after MaxAttempts it is poisoned, for that subscriber alone.
//
// Relays of 0.1.0 still write catch_up lists during a deploy; the lane turns
// them into pairs first (outbox_convert_catch_up, migration 006).

// convertEvery is how often a relay looks for catch_up lists written by
// relays of 0.1.0, when the last look found none.
const convertEvery = time.Second

// convertBatch is how many events one conversion takes.
const convertBatch = 1000

// owedOrFail runs the deliveries lane until it has nothing more due for this
// relay. On a failed round it backs off with fail (which reports whether to
// go on) and retries the claimed events one by one. It reports whether the
// loop should go on.
func (r *Relay) owedOrFail(ctx context.Context, fail func(context.Context, error) bool) bool {
	if len(r.known) == 0 {
		return true
	}
	if err := r.convertCatchUp(ctx); err != nil {
		return fail(ctx, err)
	}
	for !r.stopping() && ctx.Err() == nil {
		claimed, err := r.round(ctx, laneOwed, r.sql.ClaimOwed, r.known, int64(r.config.BatchSize))
		if err != nil {
			if !fail(ctx, err) {
				return false
			}
			if err := r.rowByRow(ctx, laneOwed, claimed); err != nil && ctx.Err() == nil {
				r.logger.WarnContext(ctx, "events: row-by-row retry of owed deliveries interrupted", slog.String("err", err.Error()))
			}
			return true
		}
		if len(claimed) < r.config.BatchSize {
			return true
		}
	}
	return false
}

// convertCatchUp turns catch_up lists of relays of 0.1.0 into owed pairs:
// at most once per convertEvery while there are none.
func (r *Relay) convertCatchUp(ctx context.Context) error {
	if time.Now().Before(r.convertAt) {
		return nil
	}
	for !r.stopping() && ctx.Err() == nil {
		var n int64
		if err := r.pool.QueryRow(ctx, r.sql.ConvertCatchUp, convertBatch).Scan(&n); err != nil {
			return err
		}
		if n < convertBatch {
			break
		}
	}
	r.convertAt = time.Now().Add(convertEvery)
	return nil
}
