package engine

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/standmeet/events/internal/claimfloor"
	"github.com/standmeet/events/internal/owedfloor"
)

// Probes: the steps of the engine's claims, one at a time, for tests (this
// package's database tests, package engine_test, and the root package's),
// which run them against a real database in states a relay's loops reach
// only by chance (a look blocked on a lock, a claim in the window between
// two snapshots, a floor after a drain). Nothing else calls them.

// LookBelow runs one look below the claim floor (floorLooker's).
func (r *Relay) LookBelow(ctx context.Context, look claimfloor.Below) (found *int64, err error) {
	return r.lookBelow(ctx, look)
}

// SetClaimFloor replaces the claim floor, between probes, never during a
// run (its loops read it unlocked).
func (r *Relay) SetClaimFloor(f *claimfloor.Floor) { r.claimFloor = f }

// ClaimPending begins a pending-lane batch claim of size rows as the
// relay's own rounds do (from the claim floor), and returns its
// transaction, the events claimed, ended (call it once the transaction
// has committed or failed: it moves the floor) and release.
func (r *Relay) ClaimPending(ctx context.Context, size int) (tx pgx.Tx, batch []Event, ended func(committed bool), release func(), err error) {
	tx, rows, ended, release, err := r.beginClaim(ctx, r.pool, true, LanePending, r.sql.ClaimBatch, []any{int64(size)})
	if err != nil {
		return nil, nil, nil, nil, err
	}
	for _, c := range rows {
		batch = append(batch, c.Event)
	}
	return tx, batch, ended, release, nil
}

// OwedFloors are the current (or last) run's owed floors; nil before the
// first run.
func (r *Relay) OwedFloors() *owedfloor.Floors { return r.owedFloors }

// SetOwedFloors replaces the owed floors, between probes, never during a
// run (its loops read it unlocked).
func (r *Relay) SetOwedFloors(f *owedfloor.Floors) { r.owedFloors = f }

// ClaimOwed runs the deliveries lane's claim of at most batch pairs of the
// unordered subscribers names inside tx, starting at from (one position per
// name), and returns how many events it claimed, and observe, which moves
// the owed floors as the round's commit would.
func (r *Relay) ClaimOwed(ctx context.Context, tx pgx.Tx, names []string, batch int, from []owedfloor.Position) (n int, observe func(), err error) {
	due, seq := floorArgs(from)
	rows, err := tx.Query(ctx, r.sql.ClaimOwed, names, int64(batch), make([]bool, len(names)), int32(owedLockClass), due, seq)
	if err != nil {
		return 0, nil, err
	}
	claimed, err := collectClaimed(rows, LaneOwed)
	if err != nil {
		return 0, nil, err
	}
	return len(claimed), func() { r.observeOwed(claimed, names, due, seq) }, nil
}

// FreshLast is when a pending round last claimed rows.
func (r *Relay) FreshLast() time.Time { return r.fresh.last() }
