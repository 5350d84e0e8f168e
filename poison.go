package events

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/standmeet/events/internal/backoff"
)

// maxErrorLength bounds last_error.
const maxErrorLength = 2000

// queueCharges queues, in b, one failed attempt for each failure: attempts+1,
// last_error, the next attempt's time, and poisoned_at once attempts reach
// MaxAttempts. After b is sent, the returned function lists the failures that
// this call poisoned.
func (r *Relay) queueCharges(b *pgx.Batch, failures []rowFailure) func() []rowFailure {
	poisoned := make([]bool, len(failures))
	for i, f := range failures {
		msg := f.err.Error()
		if len(msg) > maxErrorLength {
			msg = msg[:maxErrorLength]
		}
		delay := backoff.Delay(f.row.attempts+1, r.config.RetryBackoff, r.config.MaxRetryBackoff)
		b.Queue(r.sql.charge, f.row.Seq, msg, delay, r.config.MaxAttempts).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&poisoned[i])
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // fanned out or poisoned meanwhile by another relay
			}
			return err
		})
		r.logger.Warn("events: fanning out an event failed",
			slog.String("event_id", f.row.ID.String()), slog.String("type", f.row.Type),
			slog.Int("attempt", f.row.attempts+1), slog.Duration("next_in", delay), slog.String("err", msg))
	}
	return func() []rowFailure {
		var out []rowFailure
		for i, p := range poisoned {
			if p {
				out = append(out, failures[i])
			}
		}
		return out
	}
}

// alert reports an event this relay just poisoned.
func (r *Relay) alert(ctx context.Context, e Event, err error) {
	r.logger.ErrorContext(ctx, "events: event poisoned: it will not be fanned out until requeued",
		slog.String("event_id", e.ID.String()), slog.String("type", e.Type),
		slog.String("subject", e.Subject), slog.String("err", err.Error()))
	if r.config.OnPoison != nil {
		r.config.OnPoison(ctx, e, err)
	}
}

// isRowFault tells a failure that belongs to the claimed rows (their data, or
// what a subscriber made of it) from a failure of the database or the
// network, which must never count against a row. tx is the failed round's
// transaction, not yet rolled back.
func isRowFault(ctx context.Context, tx pgx.Tx, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// Data exceptions (22…) and integrity violations (23…) come from what
		// was written. Everything else (connection loss 08, shutdown and
		// cancel 57, serialization and deadlock 40, resources 53, locks 55,
		// configuration 42) is the database's state, not the row's.
		class := pgErr.Code[:2]
		return class == "22" || class == "23"
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || pgconn.Timeout(err) || pgconn.SafeToRetry(err) {
		return false
	}
	// Anything else was refused before reaching the database (River's checks
	// of job args and insert options) — if the connection still answers.
	if tx == nil || tx.Conn().IsClosed() {
		return false
	}
	_, probeErr := tx.Exec(ctx, "SELECT 1")
	return probeErr == nil
}
