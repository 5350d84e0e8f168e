// Package maintenance holds a relay's background duties, each run on a
// goroutine of its own beside the rounds, never in a host's transaction, as
// River's internal/maintenance holds its job cleaner and rescuer: retention
// (Pruner), the relay's heartbeat (Heartbeat) and the ordered subscribers'
// chains (ChainSweeper).
package maintenance

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// ownTx is the isolation of the duties' own transactions: READ COMMITTED,
// whatever the database's default (under REPEATABLE READ a row lock that
// meets a concurrent update fails with 40001 instead of waiting).
var ownTx = pgx.TxOptions{IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadWrite}

// sleep waits d unless stopping closes or ctx ends first; it reports whether
// to go on.
func sleep(ctx context.Context, stopping <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stopping:
	case <-ctx.Done():
	}
	return false
}

// stopped reports whether stopping has closed or ctx ended.
func stopped(ctx context.Context, stopping <-chan struct{}) bool {
	select {
	case <-stopping:
		return true
	default:
		return ctx.Err() != nil
	}
}
