package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/standmeet/events/internal/backoff"
	"github.com/standmeet/events/internal/claimfloor"
)

// The claim floor's looks below it (package claimfloor): on its schedule,
// in transactions of their own, and at once after the database was away.

// floorLooker looks below the claim floor on the floor's schedule (see
// package claimfloor), in transactions of its own, so that no claim walks
// what the look walks: under a held snapshot, the dead index entries of
// every event fanned out since. A pending row found there lowers the floor
// to it, and the main loop claims. A look that fails is due again after a
// backoff; Stop cancels one in flight.
func (r *Relay) floorLooker(ctx context.Context) {
	stopping := r.run.Stopping() // read here: the run's field is reset once its goroutines end
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	failures := 0
	for {
		if r.sleep(ctx, r.claimFloor.NextLookIn(time.Now()), r.floorLookSoon) == sleepStopped {
			return
		}
		look, ok := r.claimFloor.LookBelow(time.Now())
		if !ok {
			continue
		}
		found, err := r.lookBelow(ctx, look)
		if err != nil {
			if ctx.Err() != nil || r.stopping() {
				return
			}
			failures++
			delay := backoff.Delay(failures, r.config.RetryBackoff, r.config.MaxRetryBackoff)
			r.claimFloor.LookFailed(look, time.Now().Add(delay))
			r.config.Logger.WarnContext(ctx, "events: looking below the claim floor failed; looking again after a pause",
				slog.String("err", err.Error()), slog.Duration("pause", delay))
			continue
		}
		failures = 0
		if found != nil {
			r.claimFloor.Lower(*found)
			r.wake.Send()
		}
	}
}

// lookBelow looks for a pending row below the floor that no one holds, and
// returns its transaction (nil: none). It runs READ COMMITTED whatever the
// database's default (the look locks the row it finds, which a round may
// have stamped meanwhile: a snapshot of the transaction's start would fail
// with a serialization error), and with no statement_timeout: under a held
// snapshot a look from the start walks every dead entry, and one cut short
// every time would leave rows below the floor for as long as the snapshot
// is held.
func (r *Relay) lookBelow(ctx context.Context, look claimfloor.Below) (found *int64, err error) {
	err = pgx.BeginTxFunc(ctx, r.pool, OwnTx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL statement_timeout = 0"); err != nil {
			return err
		}
		return tx.QueryRow(ctx, r.sql.PendingBelow, look.From, look.Below, look.BelowSeq, look.Dropped, look.Skip).Scan(&found)
	})
	return found, err
}

// lookBelowSoon makes the look below the claim floor from the start due at
// once, and the next claim of owed pairs a look: the database restarted or
// was away, and a crash may have lost the asynchronous commits of rounds
// that moved the floors.
func (r *Relay) lookBelowSoon() {
	r.claimFloor.LookSoon()
	r.owedFloors.Reset()
	r.floorLookSoon.Send()
}
