package events

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/standmeet/events/internal/glob"
)

// DeliveryInfo is a delivery — an event owed to one subscriber — still owed
// or poisoned, as [Outbox.ListDeliveries] and [Outbox.GetEvent] report it. A
// delivery made has no state of its own: the event's Fanout names its job.
type DeliveryInfo struct {
	// EventID, Seq, Type and Subject are the event's.
	EventID uuid.UUID
	Seq     int64
	Type    string
	Subject string
	// Subscriber is the subscriber the event is owed to.
	Subscriber string
	// Attempts counts failed attempts since the delivery was owed or last
	// requeued.
	Attempts int
	// LastError is the error of the last failed attempt; empty if none.
	LastError string
	// Errors is the history of the last 10 failed attempts, oldest first,
	// kept across requeues.
	Errors []AttemptError
	// NextAttemptAt is when a relay that knows the subscriber tries next.
	NextAttemptAt time.Time
	// PoisonedAt is when the delivery was set aside; zero unless poisoned.
	PoisonedAt time.Time
	// OwedSince is when the delivery was first owed.
	OwedSince time.Time
}

// Poisoned reports whether the delivery is set aside until [Outbox.Requeue]
// or [Outbox.Discard].
func (d *DeliveryInfo) Poisoned() bool { return !d.PoisonedAt.IsZero() }

// AttemptError is one failed attempt of a delivery.
type AttemptError struct {
	At    time.Time `json:"at"`
	Error string    `json:"error"`
}

func scanDelivery(row pgx.CollectableRow) (DeliveryInfo, error) {
	var (
		d         DeliveryInfo
		lastError *string
		poisoned  *time.Time
		history   []byte
	)
	err := row.Scan(&d.Seq, &d.EventID, &d.Type, &d.Subject, &d.Subscriber, &d.Attempts, &lastError, &history,
		&d.NextAttemptAt, &poisoned, &d.OwedSince)
	if err != nil {
		return d, err
	}
	if lastError != nil {
		d.LastError = *lastError
	}
	d.PoisonedAt = deref(poisoned)
	if len(history) > 0 {
		if err := json.Unmarshal(history, &d.Errors); err != nil {
			return d, fmt.Errorf("error history: %w", err)
		}
	}
	return d, nil
}

// DeliveryState selects the deliveries [Outbox.ListDeliveries] lists.
type DeliveryState string

// The states of [ListDeliveriesParams].
const (
	// DeliveryOwed: still to be made (retrying, or owed to a
	// subscriber no relay has served yet, or paused).
	DeliveryOwed DeliveryState = "owed"
	// DeliveryPoisoned: set aside until requeued or discarded.
	DeliveryPoisoned DeliveryState = "poisoned"
)

// ListDeliveriesParams selects and pages the deliveries [Outbox.ListDeliveries] lists.
type ListDeliveriesParams struct {
	// State selects the deliveries. Defaults to DeliveryPoisoned.
	State DeliveryState
	// Type filters by event type with a glob, as [Subscriber.Types]. Empty
	// means every type.
	Type string
	// Subscriber filters by subscriber name. Empty means every subscriber.
	Subscriber string
	// EventIDs lists only these events' deliveries (a page of
	// [Outbox.ListEvents], say). Empty means every event.
	EventIDs []uuid.UUID
	// Limit is the page size. Defaults to ListLimitDefault (50); at most
	// 1000.
	Limit int
	// After is the Next cursor of the previous page; empty for the first.
	After string
}

// ListDeliveriesResult is one page of deliveries.
type ListDeliveriesResult struct {
	Deliveries []DeliveryInfo
	// Next is the cursor of the following page; empty on the last page.
	Next string
}

// ListDeliveries lists deliveries that are owed or poisoned,
// by event and subscriber, a page at a time.
func (o Outbox) ListDeliveries(ctx context.Context, db DB, params ListDeliveriesParams) (ListDeliveriesResult, error) {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return ListDeliveriesResult{}, err
	}
	state := cmp.Or(params.State, DeliveryPoisoned)
	if state != DeliveryOwed && state != DeliveryPoisoned {
		return ListDeliveriesResult{}, invalidf(ErrInvalidArgument, "State", "%q: use owed or poisoned", params.State)
	}
	limit := cmp.Or(params.Limit, ListLimitDefault)
	if limit < 1 || limit > 1000 {
		return ListDeliveriesResult{}, invalidf(ErrInvalidArgument, "Limit", "%d: must be between 1 and 1000", params.Limit)
	}
	typeRE, err := typeRegexp(params.Type)
	if err != nil {
		return ListDeliveriesResult{}, err
	}
	var (
		subscriber, afterSub *string
		afterSeq             *int64
	)
	if params.Subscriber != "" {
		subscriber = &params.Subscriber
	}
	if params.After != "" {
		seqStr, sub, ok := strings.Cut(params.After, ".")
		seq, err := strconv.ParseInt(seqStr, 10, 64)
		if !ok || err != nil {
			return ListDeliveriesResult{}, invalidf(ErrInvalidArgument, "After", "%q: not a cursor from a previous page", params.After)
		}
		afterSeq, afterSub = &seq, &sub
	}
	var eventIDs []uuid.UUID // NULL: every event
	if len(params.EventIDs) > 0 {
		eventIDs = params.EventIDs
	}
	rows, err := db.Query(ctx, sql.ListDeliveries, limit+1, string(state), typeRE, subscriber, afterSeq, afterSub, eventIDs)
	if err != nil {
		return ListDeliveriesResult{}, fmt.Errorf("events: list deliveries: %w", err)
	}
	list, err := pgx.CollectRows(rows, scanDelivery)
	if err != nil {
		return ListDeliveriesResult{}, fmt.Errorf("events: list deliveries: %w", err)
	}
	var res ListDeliveriesResult
	if len(list) > limit {
		list = list[:limit]
		last := list[limit-1]
		res.Next = fmt.Sprintf("%d.%s", last.Seq, last.Subscriber)
	}
	res.Deliveries = list
	return res, nil
}

// typeRegexp compiles an optional type glob to its SQL regular expression.
func typeRegexp(glb string) (*string, error) {
	if glb == "" {
		return nil, nil
	}
	p, err := glob.Compile(glb)
	if err != nil {
		return nil, invalidf(ErrInvalidArgument, "Type", "%v", err)
	}
	re := p.Regexp()
	return &re, nil
}

// PauseSubscriber pauses one subscriber: from the next round on, no relay
// maps or inserts anything for it; its events stay owed to it (as deliveries),
// while every other subscriber's flow. [Outbox.ResumeSubscriber] lets the relays
// deliver what it is owed. It returns an error wrapping
// [ErrUnknownSubscriber] for a name not registered (or retired).
func (o Outbox) PauseSubscriber(ctx context.Context, db DB, name string) error {
	return o.pause(ctx, db, name, true)
}

// ResumeSubscriber resumes a paused subscriber and wakes the relays. Resuming
// one that is not paused is not an error.
func (o Outbox) ResumeSubscriber(ctx context.Context, db DB, name string) error {
	return o.pause(ctx, db, name, false)
}

func (o Outbox) pause(ctx context.Context, db DB, name string, pause bool) error {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return err
	}
	var got string
	if pause {
		err = db.QueryRow(ctx, sql.Pause, name).Scan(&got)
	} else {
		err = db.QueryRow(ctx, sql.Resume, name).Scan(&got, nil)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %q", ErrUnknownSubscriber, name)
	}
	if err != nil {
		return fmt.Errorf("events: pause or resume %q: %w", name, err)
	}
	return nil
}
