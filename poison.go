package events

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

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
	if len(failures) > 0 {
		r.retryCheck.Store(true)
	}
	poisoned := make([]bool, len(failures))
	for i, f := range failures {
		msg := f.err.Error()
		if len(msg) > maxErrorLength {
			msg = msg[:maxErrorLength]
		}
		delay := backoff.Delay(f.row.attempts+1, r.config.RetryBackoff, r.config.MaxRetryBackoff)
		charge := r.sql.charge
		if f.row.catchUp != nil {
			charge = r.sql.chargeCatchUp
		}
		b.Queue(charge, f.row.Seq, msg, delay, r.config.MaxAttempts).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&poisoned[i], nil)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // fanned out or poisoned meanwhile by another relay
			}
			return err
		})
		if r.hooks.charged != nil {
			r.hooks.charged(f.row.Seq, f.row.attempts+1, delay)
		}
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

// alert reports an event this relay just poisoned: an error log at once,
// and OnPoison off the loop (see Config.OnPoison).
func (r *Relay) alert(ctx context.Context, e Event, err error) {
	attrs := []slog.Attr{slog.String("event_id", e.ID.String()), slog.String("type", e.Type),
		slog.String("subject", e.Subject), slog.String("err", err.Error())}
	r.logger.LogAttrs(ctx, slog.LevelError, "events: event poisoned: it will not be fanned out until requeued", attrs...)
	if onPoison := r.config.OnPoison; onPoison != nil {
		r.callbacks.Go("OnPoison", attrs, func(ctx context.Context) { onPoison(ctx, e, err) })
	}
}

// isRowFault tells a failure that belongs to the claimed rows (their data, or
// what a subscriber made of it) from a failure of the database or the
// network, which must never count against a row. tx is the failed round's
// transaction, not yet rolled back.
func isRowFault(ctx context.Context, tx pgx.Tx, err error) bool {
	if ctx.Err() != nil || errors.Is(err, errStopping) {
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
	if isConnError(err) {
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

// isConnError reports a failure to talk to the database at all: the network,
// a closed connection, a timeout.
func isConnError(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || pgconn.Timeout(err) || pgconn.SafeToRetry(err)
}

// isTransient reports a failure that passes when the database is back: a
// lost connection, a server shutting down or starting, too many connections.
func isTransient(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", "57", "53", "40":
			return true
		}
		return false
	}
	return isConnError(err)
}

// EventInfo is an event with the relay's state of it, for an operator's view.
type EventInfo struct {
	Event

	// FannedOutAt is when a relay fanned the event out; zero until then.
	FannedOutAt time.Time
	// Fanout maps each subscriber that got a job to the River job's ID. Nil
	// until fanned out; empty when no subscriber matched.
	Fanout map[string]int64
	// Attempts counts failed attempts to fan the event out.
	Attempts int
	// LastError is the error of the last failed attempt.
	LastError string
	// NextAttemptAt is when a failed event will be tried again; zero when not
	// waiting.
	NextAttemptAt time.Time
	// PoisonedAt is when the event was set aside; zero unless poisoned.
	PoisonedAt time.Time
}

// Poisoned reports whether the event is set aside until [Requeue].
func (e *EventInfo) Poisoned() bool { return !e.PoisonedAt.IsZero() }

const infoColumns = "seq, id, type, subject, payload, created_at, fanned_out_at, fanout, attempts, last_error, next_attempt_at, poisoned_at"

func scanInfo(row pgx.Row) (EventInfo, error) {
	var (
		e                                      EventInfo
		fannedOutAt, nextAttemptAt, poisonedAt *time.Time
		lastError                              *string
	)
	err := row.Scan(&e.Seq, &e.ID, &e.Type, &e.Subject, &e.Payload, &e.CreatedAt,
		&fannedOutAt, &e.Fanout, &e.Attempts, &lastError, &nextAttemptAt, &poisonedAt)
	if err != nil {
		return EventInfo{}, err
	}
	for dst, src := range map[*time.Time]*time.Time{&e.FannedOutAt: fannedOutAt, &e.NextAttemptAt: nextAttemptAt, &e.PoisonedAt: poisonedAt} {
		if src != nil {
			*dst = *src
		}
	}
	if lastError != nil {
		e.LastError = *lastError
	}
	return e, nil
}

// Inspect returns one event with its relay state, or an error wrapping
// [ErrNotFound].
func Inspect(ctx context.Context, db DB, id uuid.UUID) (EventInfo, error) {
	return Outbox{}.Inspect(ctx, db, id)
}

// Inspect is [Inspect] in o's schema.
func (o Outbox) Inspect(ctx context.Context, db DB, id uuid.UUID) (EventInfo, error) {
	if err := validateSchema(o.Schema); err != nil {
		return EventInfo{}, err
	}
	e, err := scanInfo(db.QueryRow(ctx, "SELECT "+infoColumns+" FROM "+qualify(o.Schema, tableName)+" WHERE id = $1", id))
	if errors.Is(err, pgx.ErrNoRows) {
		return EventInfo{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return EventInfo{}, fmt.Errorf("events: inspect %s: %w", id, err)
	}
	return e, nil
}

// ListPoisonedParams pages through poisoned events.
type ListPoisonedParams struct {
	// Limit is the page size. Defaults to 50; at most 1000.
	Limit int
	// After is the Next cursor of the previous page; empty for the first.
	After string
}

// ListPoisonedResult is one page of poisoned events.
type ListPoisonedResult struct {
	// Events are newest poisoning first.
	Events []EventInfo
	// Next is the cursor of the following page; empty on the last page.
	Next string
}

// ListPoisoned lists poisoned events, most recently poisoned first, a page
// at a time. A nil params means the first page of 50.
func ListPoisoned(ctx context.Context, db DB, params *ListPoisonedParams) (ListPoisonedResult, error) {
	return Outbox{}.ListPoisoned(ctx, db, params)
}

// ListPoisoned is [ListPoisoned] in o's schema.
func (o Outbox) ListPoisoned(ctx context.Context, db DB, params *ListPoisonedParams) (ListPoisonedResult, error) {
	if err := validateSchema(o.Schema); err != nil {
		return ListPoisonedResult{}, err
	}
	if params == nil {
		params = &ListPoisonedParams{}
	}
	limit := params.Limit
	switch {
	case limit == 0:
		limit = 50
	case limit < 0 || limit > 1000:
		return ListPoisonedResult{}, fmt.Errorf("events: list poisoned: Limit %d: must be between 1 and 1000", limit)
	}
	// Keyset pagination on the poisoned index: (poisoned_at, seq) descending.
	where, args := "poisoned_at IS NOT NULL", []any{limit + 1}
	if params.After != "" {
		at, seq, err := parseCursor(params.After)
		if err != nil {
			return ListPoisonedResult{}, err
		}
		where += " AND (poisoned_at, seq) < ($2, $3)"
		args = append(args, at, seq)
	}
	rows, err := db.Query(ctx, "SELECT "+infoColumns+" FROM "+qualify(o.Schema, tableName)+
		" WHERE "+where+" ORDER BY poisoned_at DESC, seq DESC LIMIT $1", args...)
	if err != nil {
		return ListPoisonedResult{}, fmt.Errorf("events: list poisoned: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (EventInfo, error) { return scanInfo(row) })
	if err != nil {
		return ListPoisonedResult{}, fmt.Errorf("events: list poisoned: %w", err)
	}
	var res ListPoisonedResult
	if len(list) > limit {
		list = list[:limit]
		last := list[limit-1]
		res.Next = fmt.Sprintf("%d.%d", last.PoisonedAt.UnixMicro(), last.Seq)
	}
	res.Events = list
	return res, nil
}

func parseCursor(c string) (time.Time, int64, error) {
	atStr, seqStr, ok := strings.Cut(c, ".")
	at, err1 := strconv.ParseInt(atStr, 10, 64)
	seq, err2 := strconv.ParseInt(seqStr, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return time.Time{}, 0, fmt.Errorf("events: list poisoned: After %q is not a cursor from a previous page", c)
	}
	return time.UnixMicro(at), seq, nil
}

// Requeue puts a poisoned event back in the queue: it clears poisoned_at,
// attempts and last_error, and wakes the relays, which fan it out as usual.
// It returns an error wrapping [ErrNotFound] for an unknown ID and
// [ErrNotPoisoned] for an event that is not poisoned. With db a transaction,
// the relays see the requeue when it commits.
func Requeue(ctx context.Context, db DB, id uuid.UUID) error {
	return Outbox{}.Requeue(ctx, db, id)
}

// Requeue is [Requeue] in o's schema.
func (o Outbox) Requeue(ctx context.Context, db DB, id uuid.UUID) error {
	if err := validateSchema(o.Schema); err != nil {
		return err
	}
	t := qualify(o.Schema, tableName)
	var exists, requeued bool
	err := db.QueryRow(ctx, `WITH requeued AS (
			UPDATE `+t+` SET poisoned_at = NULL, attempts = 0, last_error = NULL, next_attempt_at = NULL
			 WHERE id = $1 AND poisoned_at IS NOT NULL
			RETURNING seq, pg_notify('`+ChannelEvents+`', ''))
		SELECT EXISTS (SELECT 1 FROM `+t+` WHERE id = $1), EXISTS (SELECT 1 FROM requeued)`, id).Scan(&exists, &requeued)
	switch {
	case err != nil:
		return fmt.Errorf("events: requeue %s: %w", id, err)
	case !exists:
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	case !requeued:
		return fmt.Errorf("%w: %s", ErrNotPoisoned, id)
	}
	return nil
}
