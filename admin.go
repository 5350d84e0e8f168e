package events

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

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

// infoRow is an outbox row as Inspect and ListPoisoned select it.
type infoRow struct {
	Event
	FannedOutAt, NextAttemptAt, PoisonedAt *time.Time
	Fanout                                 map[string]int64
	Attempts                               int
	LastError                              *string
}

func scanInfo(row pgx.CollectableRow) (EventInfo, error) {
	r, err := pgx.RowToStructByName[infoRow](row)
	if err != nil {
		return EventInfo{}, err
	}
	e := EventInfo{Event: r.Event, FannedOutAt: deref(r.FannedOutAt), Fanout: r.Fanout, Attempts: r.Attempts,
		NextAttemptAt: deref(r.NextAttemptAt), PoisonedAt: deref(r.PoisonedAt)}
	if r.LastError != nil {
		e.LastError = *r.LastError
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
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return EventInfo{}, err
	}
	rows, err := db.Query(ctx, sql.Inspect, id)
	if err != nil {
		return EventInfo{}, fmt.Errorf("events: inspect %s: %w", id, err)
	}
	e, err := pgx.CollectExactlyOneRow(rows, scanInfo)
	if errors.Is(err, pgx.ErrNoRows) {
		return EventInfo{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return EventInfo{}, fmt.Errorf("events: inspect %s: %w", id, err)
	}
	return e, nil
}

// ListPoisonedLimitDefault is the page size of [ListPoisoned] when
// [ListPoisonedParams.Limit] is zero.
const ListPoisonedLimitDefault = 50

// ListPoisonedParams pages through poisoned events.
type ListPoisonedParams struct {
	// Limit is the page size. Defaults to ListPoisonedLimitDefault (50); at
	// most 1000.
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
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return ListPoisonedResult{}, err
	}
	if params == nil {
		params = &ListPoisonedParams{}
	}
	limit := cmp.Or(params.Limit, ListPoisonedLimitDefault)
	if limit < 1 || limit > 1000 {
		return ListPoisonedResult{}, invalidf(ErrInvalidArgument, "Limit", "%d: must be between 1 and 1000", params.Limit)
	}
	query, args := sql.ListPoisoned, []any{limit + 1}
	if params.After != "" {
		at, seq, err := parseCursor(params.After)
		if err != nil {
			return ListPoisonedResult{}, err
		}
		query, args = sql.ListPoisonedAfter, append(args, at, seq)
	}
	rows, err := db.Query(ctx, query, args...)
	if err != nil {
		return ListPoisonedResult{}, fmt.Errorf("events: list poisoned: %w", err)
	}
	list, err := pgx.CollectRows(rows, scanInfo)
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
		return time.Time{}, 0, invalidf(ErrInvalidArgument, "After", "%q: not a cursor from a previous page", c)
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
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return err
	}
	var exists, requeued bool
	err = db.QueryRow(ctx, sql.Requeue, id).Scan(&exists, &requeued)
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

// Discard deletes a poisoned event for good, on an operator's decision (an
// event that can never be delivered, say). It returns an error wrapping
// [ErrNotFound] for an unknown ID and [ErrNotPoisoned] for an event that is
// not poisoned: only poisoned events can be discarded. Retention never
// deletes poisoned events on its own.
func Discard(ctx context.Context, db DB, id uuid.UUID) error {
	return Outbox{}.Discard(ctx, db, id)
}

// Discard is [Discard] in o's schema.
func (o Outbox) Discard(ctx context.Context, db DB, id uuid.UUID) error {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return err
	}
	var exists, discarded bool
	err = db.QueryRow(ctx, sql.Discard, id).Scan(&exists, &discarded)
	switch {
	case err != nil:
		return fmt.Errorf("events: discard %s: %w", id, err)
	case !exists:
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	case !discarded:
		return fmt.Errorf("%w: %s", ErrNotPoisoned, id)
	}
	return nil
}
