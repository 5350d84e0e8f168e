package events

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
)

// FanoutTx fans out, inside tx, every event pending now — committed ones, and
// those recorded in tx itself — as the relay's rounds would: jobs inserted
// through client, rows stamped, all in tx, so nothing is visible until tx
// commits and a rollback undoes it. It registers the relay's subscribers in
// tx first. It returns how many events it claimed.
//
// It starts no goroutine and needs no LISTEN: it is for tests (see package
// eventstest) and for hosts that drive fan-out themselves. An event whose
// mapping fails is charged an attempt like in a round; a failure of a whole
// batch returns the error, and the caller's transaction is still usable
// (each round runs in a savepoint). The relay must not be started: it
// returns an error wrapping [ErrStarted] otherwise, and [Relay.Start]
// returns one while a FanoutTx call runs. [Relay.Stop] leaves a call in
// progress alone: ctx bounds it.
func (r *Relay) FanoutTx(ctx context.Context, tx pgx.Tx, client *river.Client[pgx.Tx]) (int, error) {
	if client == nil {
		return 0, invalidf(ErrInvalidConfig, "client", "is nil")
	}
	if err := r.checkSchema(client); err != nil {
		return 0, err
	}
	// The relay is borrowed for this call: its run state is set under mu
	// with inTx, so Start refuses meanwhile; Stop finds no run to stop.
	r.mu.Lock()
	if r.inTx || r.svc.Active() {
		r.mu.Unlock()
		return 0, fmt.Errorf("%w: FanoutTx is for a relay that is not started", ErrStarted)
	}
	if r.svc.Lingering() {
		r.mu.Unlock()
		return 0, errLastRunLingers
	}
	r.inTx = true
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.inTx = false
		r.mu.Unlock()
	}()
	active, err := r.register(ctx, tx)
	if err != nil {
		return 0, err
	}
	n, err := r.eng.FanoutIn(ctx, tx, r.engineConfig(), client, active)
	if err != nil {
		return n, fmt.Errorf("events: fan out in tx: %w", err)
	}
	return n, nil
}
