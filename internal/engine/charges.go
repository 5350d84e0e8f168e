package engine

import (
	"context"
	"errors"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/standmeet/events/internal/backoff"
	"github.com/standmeet/events/internal/safetext"
)

// MaxErrorLength bounds last_error, in bytes.
const MaxErrorLength = 2000

// storableError is err's text as last_error keeps it: the host wrote it, so
// it may hold invalid UTF-8 or NUL bytes, which PostgreSQL refuses (a refused
// charge would fail the whole round), and be of any length. See
// [safetext.Clip].
func storableError(err error) string {
	return safetext.Clip(err.Error(), MaxErrorLength)
}

// queueCharges queues, in b, one failed attempt for each failure: attempts+1,
// last_error, the next attempt's time, and poisoned_at once attempts reach
// MaxAttempts. After b is sent, the returned function lists the failures that
// this call poisoned.
func (r *Relay) queueCharges(b *pgx.Batch, failures []rowFailure) func() []rowFailure {
	if len(failures) > 0 {
		r.retryCheck.Store(true)
	}
	poisoned := make([]bool, len(failures))
	for i, f := range failures {
		msg := storableError(f.err)
		delay := backoff.Delay(f.row.attempts+1, r.config.RetryBackoff, r.config.MaxRetryBackoff)
		b.Queue(r.sql.Charge, f.row.Seq, msg, delay.Microseconds(), r.config.MaxAttempts).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&poisoned[i], nil)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // fanned out or poisoned meanwhile by another relay
			}
			return err
		})
		r.config.Metrics.Failures.Add(context.Background(), 1)
		if r.Hooks.Charged != nil {
			r.Hooks.Charged(f.row.Seq, f.row.attempts+1, delay)
		}
		r.config.Logger.Warn("events: fanning out an event failed",
			slog.String("event_id", f.row.ID.String()), slog.Int64("seq", f.row.Seq), slog.String("type", f.row.Type),
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

// alert reports an event this relay just poisoned: an error log at once,
// and OnPoison off the loop (see RelayConfig.OnPoison). The log gets the error's
// stored form; OnPoison gets err itself.
func (r *Relay) alert(ctx context.Context, e Event, err error) {
	attrs := []slog.Attr{slog.String("event_id", e.ID.String()), slog.Int64("seq", e.Seq), slog.String("type", e.Type),
		slog.String("subject", e.Subject), slog.String("err", storableError(err))}
	r.config.Logger.LogAttrs(ctx, slog.LevelError, "events: event poisoned: it will not be fanned out until requeued", attrs...)
	r.config.Metrics.Poisoned.Add(ctx, 1)
	if onPoison := r.config.OnPoison; onPoison != nil {
		r.callbacks.Go("OnPoison", attrs, func(ctx context.Context) { onPoison(ctx, e, err) })
	}
}

// MaxPairErrorLength bounds each stored error of a delivery, in bytes.
const MaxPairErrorLength = 2000

// queueDeliveryCharges queues, in b, one failed attempt for each failed
// delivery: the delivery is written owed (or counted up), with its error in its
// history, its next attempt's time, and poisoned_at once its attempts reach
// MaxAttempts. After b is sent, the returned function lists the deliveries this
// call poisoned.
func (r *Relay) queueDeliveryCharges(b *pgx.Batch, failures []pairFailure) func() []pairFailure {
	if len(failures) == 0 {
		return func() []pairFailure { return nil }
	}
	r.retryCheck.Store(true)
	var (
		seqs   = make([]int64, len(failures))
		subs   = make([]string, len(failures))
		errs   = make([]string, len(failures))
		delays = make([]int64, len(failures))
		index  = map[[2]any]int{}
	)
	for i, f := range failures {
		msg := safetext.Clip(f.err.Error(), MaxPairErrorLength)
		delay := backoff.Delay(f.attempts+1, r.config.RetryBackoff, r.config.MaxRetryBackoff)
		seqs[i], subs[i], errs[i], delays[i] = f.row.Seq, f.sub.Name, msg, delay.Microseconds()
		index[[2]any{f.row.Seq, f.sub.Name}] = i
		r.config.Metrics.Failures.Add(context.Background(), 1)
		if r.Hooks.Charged != nil {
			r.Hooks.Charged(f.row.Seq, f.attempts+1, delay)
		}
		r.config.Logger.Warn("events: delivering an event to a subscriber failed",
			slog.String("event_id", f.row.ID.String()), slog.Int64("seq", f.row.Seq), slog.String("type", f.row.Type),
			slog.String("subscriber", f.sub.Name), slog.Int("attempt", f.attempts+1), slog.Duration("next_in", delay),
			slog.String("err", msg))
	}
	poisoned := make([]bool, len(failures))
	b.Queue(r.sql.ChargeDeliveries, seqs, subs, errs, delays, r.config.MaxAttempts).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var (
				seq int64
				sub string
				p   bool
			)
			if err := rows.Scan(&seq, &sub, &p, nil); err != nil {
				return err
			}
			if i, ok := index[[2]any{seq, sub}]; ok {
				poisoned[i] = p
			}
		}
		return rows.Err()
	})
	return func() []pairFailure {
		var out []pairFailure
		for i, p := range poisoned {
			if p {
				out = append(out, failures[i])
			}
		}
		return out
	}
}

// alertPair reports a delivery this relay just poisoned: an error log at once,
// and OnPoison off the loop (see RelayConfig.OnPoison), with the event and the
// subscriber's error as it returned it.
func (r *Relay) alertPair(ctx context.Context, f pairFailure) {
	e := f.row.Event
	attrs := []slog.Attr{slog.String("event_id", e.ID.String()), slog.Int64("seq", e.Seq), slog.String("type", e.Type),
		slog.String("subject", e.Subject), slog.String("subscriber", f.sub.Name), slog.String("err", safetext.Clip(f.err.Error(), MaxPairErrorLength))}
	r.config.Logger.LogAttrs(ctx, slog.LevelError,
		"events: delivery poisoned: this subscriber will not receive the event until it is requeued", attrs...)
	r.config.Metrics.Poisoned.Add(ctx, 1)
	if onPoison := r.config.OnPoison; onPoison != nil {
		err := f.err
		r.callbacks.Go("OnPoison", attrs, func(ctx context.Context) { onPoison(ctx, e, err) })
	}
}
