package events

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/standmeet/events/internal/startstop"
)

// RetentionDefault is how long fanned-out events are kept when
// [RelayConfig.Retention] is zero.
const RetentionDefault = 7 * 24 * time.Hour

// RetentionIntervalDefault is how often a relay runs a retention pass when
// [RelayConfig.RetentionInterval] is zero.
const RetentionIntervalDefault = time.Minute

// Retention works like River's JobCleaner: delete by seq from an
// index-driven SELECT … LIMIT, a few thousand rows per statement, under a
// short statement timeout, with smaller batches after a timeout and a pause
// between batches; one relay at a time (a transaction-level advisory
// try-lock per batch: a relay that does not get it skips the pass). It runs
// on a goroutine of the relay's own, so it never delays a round, and while
// the relay is busy (its batches come back full) it deletes only one batch a
// second: retention uses the relay's idle time, and still keeps up under
// sustained load.
const (
	pruneBatchMax    = 5000                  // rows per DELETE
	pruneBatchMin    = 100                   // after repeated timeouts
	pruneTimeout     = "5s"                  // statement_timeout of a DELETE
	pruneBatchPause  = 20 * time.Millisecond // between batches
	pruneBusyPause   = time.Second           // before each batch while the relay is busy
	pruneLockClassID = 7365109               // advisory lock: (class, hashtext(schema))
)

// pruner runs a retention pass every RetentionInterval until the relay
// stops.
func (r *Relay) pruner(ctx context.Context) {
	// The first pass soon after start.
	startstop.Every(ctx, r.run.Stopping(), r.config.RetentionInterval/10, r.config.RetentionInterval, func() { r.prune(ctx) })
}

// prune runs one retention pass; a negative Retention keeps everything.
func (r *Relay) prune(ctx context.Context) {
	if r.hooks.prunePass != nil {
		r.hooks.prunePass()
	}
	if r.config.Retention < 0 {
		return
	}
	size := pruneBatchMax
	for !r.stopping() && ctx.Err() == nil {
		if r.busy.Load() || r.owedBusy.Load() {
			// The relay drains a backlog: fan-out comes first, but not
			// forever — under sustained load retention still deletes a
			// batch a second, or the table would grow without bound.
			if !r.pause(ctx, pruneBusyPause, nil) {
				return
			}
		}
		n, locked, err := r.pruneBatch(ctx, size)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.QueryCanceled:
			size = max(size/2, pruneBatchMin)
			r.logger.WarnContext(ctx, "events: retention batch timed out; trying smaller batches", slog.Int("batch", size))
			continue
		case err != nil:
			if ctx.Err() == nil {
				r.logger.WarnContext(ctx, "events: retention pass failed", slog.String("err", err.Error()))
			}
			return
		case !locked || n < int64(size):
			return // another relay prunes, or nothing old is left
		}
		if !r.pause(ctx, pruneBatchPause, nil) {
			return
		}
	}
}

// pruneBatch deletes up to size fanned-out events older than the retention,
// if no other relay is pruning. It reports how many it deleted and whether
// it held the lock.
func (r *Relay) pruneBatch(ctx context.Context, size int) (deleted int64, locked bool, err error) {
	err = pgx.BeginTxFunc(ctx, r.pool, ownTx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, r.sql.SetLocal, "statement_timeout", pruneTimeout); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, r.sql.PruneLock, pruneLockClassID, r.sql.Schema).Scan(&locked); err != nil || !locked {
			return err
		}
		if r.hooks.pruning != nil {
			r.hooks.pruning(size)
		}
		tag, err := tx.Exec(ctx, r.sql.Prune, r.config.Retention.Microseconds(), size)
		deleted = tag.RowsAffected()
		return err
	})
	return deleted, locked, err
}
