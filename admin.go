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

	"github.com/standmeet/events/internal/glob"
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
	// LastError is the error of the last failed attempt, in the form it is
	// stored: valid UTF-8, with NUL and invalid bytes written as `\xNN`, at
	// most 2,000 bytes, cut on a rune boundary and ended with "…" if longer.
	// [RelayConfig.OnPoison] gets the error itself.
	LastError string
	// NextAttemptAt is when a failed event will be tried again; zero when not
	// waiting.
	NextAttemptAt time.Time
	// PoisonedAt is when the event was set aside: as a whole (it could not
	// be fanned out at all), or, for an event fanned out to its other
	// subscribers, for some subscriber (the latest such delivery; Attempts and
	// LastError are then that delivery's). Zero unless poisoned. Deliveries
	// tells them apart.
	PoisonedAt time.Time
	// Deliveries lists the event's deliveries that are still owed or poisoned,
	// by subscriber; filled by [Outbox.GetEvent] only.
	Deliveries []DeliveryInfo
}

// Poisoned reports whether the event, or its delivery to some subscriber, is
// set aside until [Outbox.Requeue].
func (e *EventInfo) Poisoned() bool { return !e.PoisonedAt.IsZero() }

// infoRow is an outbox row as GetEvent and ListEvents select it.
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

// GetEvent returns one event with its relay state, or an error wrapping
// [ErrNotFound].
func (o Outbox) GetEvent(ctx context.Context, db DB, id uuid.UUID) (EventInfo, error) {
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
	rows, err = db.Query(ctx, sql.DeliveriesOf, e.Seq)
	if err != nil {
		return EventInfo{}, fmt.Errorf("events: inspect %s: %w", id, err)
	}
	if e.Deliveries, err = pgx.CollectRows(rows, scanDelivery); err != nil {
		return EventInfo{}, fmt.Errorf("events: inspect %s: %w", id, err)
	}
	if e.PoisonedAt.IsZero() {
		// Poisoned for some subscriber: the latest such delivery speaks for it.
		for _, d := range e.Deliveries {
			if d.Poisoned() && d.PoisonedAt.After(e.PoisonedAt) {
				e.PoisonedAt, e.Attempts, e.LastError = d.PoisonedAt, d.Attempts, d.LastError
			}
		}
	}
	return e, nil
}

// EventState selects the events [Outbox.ListEvents] lists.
type EventState string

// The states of [ListEventsParams].
const (
	// EventPending: not fanned out yet, never failed; oldest first.
	EventPending EventState = "pending"
	// EventRetrying: failed at least once, waiting for the next attempt;
	// oldest first.
	EventRetrying EventState = "retrying"
	// EventPoisoned: set aside until Requeue or Discard, as a whole or for
	// some subscriber (see [Outbox.ListDeliveries] for the deliveries); most recently
	// poisoned first.
	EventPoisoned EventState = "poisoned"
	// EventRecent: fanned out; most recently fanned out first.
	EventRecent EventState = "recent"
)

// ListLimitDefault is the page size of [Outbox.ListEvents] when [ListEventsParams.Limit]
// is zero.
const ListLimitDefault = 50

// ListEventsParams selects and pages the events [Outbox.ListEvents] lists.
type ListEventsParams struct {
	// State selects the events. Required.
	State EventState
	// Type filters by event type with a glob, as [Subscriber.Types]
	// ("note.*", "supplier.**"). Empty means every type.
	Type string
	// Subject filters by subject, exactly. Empty means every subject.
	Subject string
	// Limit is the page size. Defaults to ListLimitDefault (50); at most
	// 1000.
	Limit int
	// After is the Next cursor of the previous page; empty for the first.
	After string
}

// ListEventsResult is one page of events.
type ListEventsResult struct {
	Events []EventInfo
	// Next is the cursor of the following page; empty on the last page.
	Next string
}

// ListEvents lists events in one state, a page at a time (keyset paging on
// the state's own index), optionally filtered by type glob and subject.
func (o Outbox) ListEvents(ctx context.Context, db DB, params ListEventsParams) (ListEventsResult, error) {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return ListEventsResult{}, err
	}
	query, ok := sql.List[string(params.State)]
	if !ok {
		return ListEventsResult{}, invalidf(ErrInvalidArgument, "State", "%q: use pending, retrying, poisoned or recent", params.State)
	}
	limit := cmp.Or(params.Limit, ListLimitDefault)
	if limit < 1 || limit > 1000 {
		return ListEventsResult{}, invalidf(ErrInvalidArgument, "Limit", "%d: must be between 1 and 1000", params.Limit)
	}
	f, err := params.filter()
	if err != nil {
		return ListEventsResult{}, err
	}
	rows, err := db.Query(ctx, query, limit+1, f.typeRE, f.subject, f.afterSeq, f.afterAt)
	if err != nil {
		return ListEventsResult{}, fmt.Errorf("events: list %s: %w", params.State, err)
	}
	list, err := pgx.CollectRows(rows, scanInfo)
	if err != nil {
		return ListEventsResult{}, fmt.Errorf("events: list %s: %w", params.State, err)
	}
	var res ListEventsResult
	if len(list) > limit {
		list = list[:limit]
		res.Next = nextCursor(params.State, list[limit-1])
	}
	res.Events = list
	return res, nil
}

// listFilter holds a list query's filters, nil where the params set none.
type listFilter struct {
	typeRE, subject *string
	afterSeq        *int64
	afterAt         *time.Time
}

// filter reads p's type glob, subject and cursor into a list query's
// filters.
func (p ListEventsParams) filter() (listFilter, error) {
	var f listFilter
	if p.Type != "" {
		g, err := glob.Compile(p.Type)
		if err != nil {
			return f, invalidf(ErrInvalidArgument, "Type", "%v", err)
		}
		re := g.Regexp()
		f.typeRE = &re
	}
	if p.Subject != "" {
		f.subject = &p.Subject
	}
	if p.After != "" {
		at, seq, err := parseCursor(p.After)
		if err != nil {
			return f, err
		}
		f.afterSeq, f.afterAt = &seq, &at
	}
	return f, nil
}

// nextCursor is the Next cursor of a page of state that ends with last:
// "<micros>.<seq>", with the time the state's list is ordered by (poisoned,
// fanned out) or 0 for the lists in seq order. parseCursor reads it.
func nextCursor(state EventState, last EventInfo) string {
	var at time.Time
	switch state {
	case EventPoisoned:
		at = last.PoisonedAt
	case EventRecent:
		at = last.FannedOutAt
	}
	micros := int64(0) // seq order: the time plays no part
	if !at.IsZero() {
		micros = at.UnixMicro()
	}
	return fmt.Sprintf("%d.%d", micros, last.Seq)
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
