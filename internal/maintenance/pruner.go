package maintenance

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/standmeet/events/internal/startstop"
	"github.com/standmeet/events/internal/statements"
)

// Retention empties whole partitions first: outbox_events is a ring of
// partitions, one written per period (migration 020), and a partition whose
// rows have all expired and owe nothing is emptied with one TRUNCATE, under
// an exclusive lock on it taken NOWAIT: a claim holds a lock on every
// partition for the length of its round, and a request waiting in the lock
// queue would hold back whatever comes after it (the next claims, a host
// transaction's read of the table), so it is tried pruneLockTries times,
// pruneLockPause apart, never queued. What is left — rows in a partition
// with some that have not expired, or one that could not be locked — works
// like River's JobCleaner: delete by seq from an index-driven SELECT …
// LIMIT, a few thousand rows per statement, under a short statement
// timeout, with smaller batches after a timeout and a pause between
// batches; one relay at a time (a transaction-level advisory try-lock per
// batch: a relay that does not get it skips the pass). It runs
// on a goroutine of the relay's own, so it never delays a round, and while
// the relay is busy (its batches come back full) it deletes only one batch a
// second: retention uses the relay's idle time, and still keeps up under
// sustained load.
const (
	PruneBatchMax    = 5000                  // rows per DELETE
	pruneBatchMin    = 100                   // after repeated timeouts
	pruneTimeout     = "5s"                  // statement_timeout of a DELETE
	pruneBatchPause  = 20 * time.Millisecond // between batches
	pruneBusyPause   = time.Second           // before each batch while the relay is busy
	pruneLockClassID = 7365109               // advisory lock: (class, hashtext(schema))
	pruneLockTries   = 20                    // NOWAIT locks of a partition per pass
	pruneLockPause   = 25 * time.Millisecond // between them
)

// Beginner begins transactions: a *pgxpool.Pool.
type Beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Pruner deletes the fanned-out events that are older than Retention and
// owe nothing, in passes every Interval.
type Pruner struct {
	DB  Beginner
	SQL *statements.Set
	// Retention is how long fanned-out events are kept; negative keeps
	// everything (passes run, and delete nothing).
	Retention time.Duration
	Interval  time.Duration
	// Busy reports whether the relay drains a backlog: fan-out comes first.
	Busy   func() bool
	Logger *slog.Logger

	// Tests' hooks: OnPass runs at the start of every pass, OnBatch
	// before every DELETE, with its size, under the lock; OnTruncate after
	// a partition was emptied.
	OnPass     func()
	OnBatch    func(size int)
	OnTruncate func(partition string)
}

// Run runs a pass soon after it starts, then every Interval, until stopping
// closes or ctx ends.
func (p *Pruner) Run(ctx context.Context, stopping <-chan struct{}) {
	startstop.Every(ctx, stopping, p.Interval/10, p.Interval, func() { p.Pass(ctx, stopping) })
}

// Pass runs one retention pass: batches until one comes back short, another
// relay holds the lock, or stopping closes.
func (p *Pruner) Pass(ctx context.Context, stopping <-chan struct{}) {
	if p.OnPass != nil {
		p.OnPass()
	}
	if p.Retention < 0 {
		return
	}
	if !p.truncateExpired(ctx, stopping) {
		return
	}
	size := PruneBatchMax
	for !stopped(ctx, stopping) {
		if p.Busy != nil && p.Busy() {
			// The relay drains a backlog: fan-out comes first, but not
			// forever — under sustained load retention still deletes a
			// batch a second, or the table would grow without bound.
			if !sleep(ctx, stopping, pruneBusyPause) {
				return
			}
		}
		n, locked, err := p.batch(ctx, size)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.QueryCanceled:
			size = max(size/2, pruneBatchMin)
			p.Logger.WarnContext(ctx, "events: retention batch timed out; trying smaller batches", slog.Int("batch", size))
			continue
		case err != nil:
			if ctx.Err() == nil {
				p.Logger.WarnContext(ctx, "events: retention pass failed", slog.String("err", err.Error()))
			}
			return
		case !locked || n < int64(size):
			return // another relay prunes, or nothing old is left
		}
		if !sleep(ctx, stopping, pruneBatchPause) {
			return
		}
	}
}

// truncateExpired empties the partitions whose rows have all expired, one
// transaction each. It reports false when the pass should end: another
// relay prunes, or stopping closed. A partition it could not lock (a long
// transaction reads or writes it) is left for the next pass, and meanwhile
// for the DELETEs.
func (p *Pruner) truncateExpired(ctx context.Context, stopping <-chan struct{}) bool {
	var parts []string
	err := pgx.BeginTxFunc(ctx, p.DB, ownTx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, p.SQL.SetLocal, "statement_timeout", pruneTimeout); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, p.SQL.ExpiredPartitions, p.Retention.Microseconds())
		if err == nil {
			parts, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		return err
	})
	if err != nil {
		if ctx.Err() == nil {
			p.Logger.WarnContext(ctx, "events: retention could not list expired partitions", slog.String("err", err.Error()))
		}
		return !stopped(ctx, stopping)
	}
	for _, part := range parts {
		var (
			locked, emptied bool
			err             error
			pgErr           *pgconn.PgError
		)
		for try := 1; ; try++ {
			if stopped(ctx, stopping) {
				return false
			}
			err = pgx.BeginTxFunc(ctx, p.DB, ownTx, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, p.SQL.SetLocal, "statement_timeout", pruneTimeout); err != nil {
					return err
				}
				if err := tx.QueryRow(ctx, p.SQL.PruneLock, pruneLockClassID, p.SQL.Schema).Scan(&locked); err != nil || !locked {
					return err
				}
				return tx.QueryRow(ctx, p.SQL.TruncateExpired, part, p.Retention.Microseconds()).Scan(&emptied)
			})
			if try == pruneLockTries || !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.LockNotAvailable {
				break
			}
			if !sleep(ctx, stopping, pruneLockPause) {
				return false
			}
		}
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.LockNotAvailable:
			p.Logger.DebugContext(ctx, "events: retention could not lock a partition; deleting its rows instead", slog.String("partition", part))
		case err != nil:
			if ctx.Err() == nil {
				p.Logger.WarnContext(ctx, "events: retention could not empty a partition", slog.String("partition", part), slog.String("err", err.Error()))
			}
		case !locked:
			return false
		case emptied && p.OnTruncate != nil:
			p.OnTruncate(part)
		}
	}
	return true
}

// batch deletes up to size fanned-out events older than the retention, if
// no other relay is pruning. It reports how many it deleted and whether it
// held the lock.
func (p *Pruner) batch(ctx context.Context, size int) (deleted int64, locked bool, err error) {
	err = pgx.BeginTxFunc(ctx, p.DB, ownTx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, p.SQL.SetLocal, "statement_timeout", pruneTimeout); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, p.SQL.PruneLock, pruneLockClassID, p.SQL.Schema).Scan(&locked); err != nil || !locked {
			return err
		}
		for _, off := range []string{"enable_hashjoin", "enable_mergejoin"} { // see Prune
			if _, err := tx.Exec(ctx, p.SQL.SetLocal, off, "off"); err != nil {
				return err
			}
		}
		if p.OnBatch != nil {
			p.OnBatch(size)
		}
		tag, err := tx.Exec(ctx, p.SQL.Prune, p.Retention.Microseconds(), size)
		deleted = tag.RowsAffected()
		return err
	})
	return deleted, locked, err
}
