package events

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// PoisonedFilter selects what [Outbox.Requeue] and [Outbox.Discard] act on:
// poisoned deliveries (an event set aside for one subscriber, as
// [Outbox.ListDeliveries] lists them) and events poisoned as a whole (their
// fan-out failed; [Outbox.ListEvents] lists both kinds with
// [EventPoisoned]). Each field set narrows the selection; the zero filter
// selects everything poisoned.
type PoisonedFilter struct {
	// EventIDs selects these events only, each acted on in a statement of
	// its own; naming one that has nothing to act on is an error (see
	// [Outbox.Requeue]). Empty means every event, a batch at a time.
	EventIDs []uuid.UUID
	// Type is a glob on the event type, as [Subscriber.Types]. Empty means
	// every type.
	Type string
	// Subscriber selects the deliveries to this subscriber only; an event
	// poisoned as a whole, which is no subscriber's, is then left alone.
	// Empty means every subscriber.
	Subscriber string
}

// Requeue puts what filter selects back in the queue and wakes the relays:
// each poisoned delivery (its attempts start again, its error history is
// kept; a relay that knows the subscriber delivers it, once) and each event
// poisoned as a whole (it is fanned out again). It returns how many it
// requeued, an event poisoned as a whole counting one and each delivery
// one.
//
// With filter.EventIDs, each event is requeued in one statement (with a
// pool, its own transaction): the event and the deliveries of it that the
// filter selects together, or nothing. An ID that names no event of the
// filter's type, or with filter.Subscriber no delivery owed or poisoned to
// that subscriber, is an error wrapping [ErrNotFound]; one whose selected
// deliveries are owed but not poisoned, [ErrNotPoisoned]. Those errors are
// joined (match them with errors.Is) and the other events are requeued.
// Without EventIDs it works in batches of 1,000, each its own statement,
// and selecting nothing is not an error. With db a transaction, the relays
// see the requeue when it commits.
func (o Outbox) Requeue(ctx context.Context, db DB, filter PoisonedFilter) (int64, error) {
	return o.settle(ctx, db, filter, true)
}

// Discard gives up what filter selects for good, on an operator's decision
// (an event that can never be delivered, say): each poisoned delivery is
// dropped (the event row, and the fanout record of every subscriber that got
// its job, stays; retention deletes the row in time), and each event
// poisoned as a whole, never fanned out, is deleted. It returns how many,
// counted as [Outbox.Requeue] counts, and works, and fails, as Requeue
// does. Retention never deletes what is poisoned on its own.
func (o Outbox) Discard(ctx context.Context, db DB, filter PoisonedFilter) (int64, error) {
	return o.settle(ctx, db, filter, false)
}

// filterBatch is how many rows one statement of Requeue or Discard by
// filter changes.
const filterBatch = 1000

// settle is Requeue (requeue) or Discard.
func (o Outbox) settle(ctx context.Context, db DB, f PoisonedFilter, requeue bool) (int64, error) {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return 0, err
	}
	typeRE, err := typeRegexp(f.Type)
	if err != nil {
		return 0, err
	}
	var subscriber *string
	if f.Subscriber != "" {
		subscriber = &f.Subscriber
	}
	verb, one, events, deliveries := "discard", sql.Discard, sql.DiscardEvents, sql.DiscardDeliveries
	if requeue {
		verb, one, events, deliveries = "requeue", sql.Requeue, sql.RequeueEvents, sql.RequeueDeliveries
	}
	// The requeue statements also return their notification's result.
	scan := func(row pgx.Row, dst ...any) error {
		if requeue {
			dst = append(dst, nil)
		}
		return row.Scan(dst...)
	}

	if len(f.EventIDs) > 0 {
		var total int64
		var errs []error
		for _, id := range f.EventIDs {
			var exists bool
			var n int64
			if err := scan(db.QueryRow(ctx, one, id, typeRE, subscriber), &exists, &n); err != nil {
				return total, errors.Join(append(errs, fmt.Errorf("events: %s %s: %w", verb, id, err))...)
			}
			total += n
			if err := settled(exists, n, id, f); err != nil {
				errs = append(errs, err)
			}
		}
		return total, errors.Join(errs...)
	}

	var total int64
	batches := func(query string, args ...any) error {
		args = append(args, filterBatch)
		for {
			var n int64
			if err := scan(db.QueryRow(ctx, query, args...), &n); err != nil {
				return fmt.Errorf("events: %s by filter: %w", verb, err)
			}
			total += n
			if n < filterBatch {
				return nil
			}
		}
	}
	if subscriber == nil {
		if err := batches(events, typeRE); err != nil {
			return total, err
		}
	}
	return total, batches(deliveries, typeRE, subscriber)
}

// settled is the error of Requeue or Discard of event id, for which the
// statement found something to act on (exists) and changed n rows.
func settled(exists bool, n int64, id uuid.UUID, f PoisonedFilter) error {
	what := id.String()
	if f.Type != "" {
		what += fmt.Sprintf(" of type %q", f.Type)
	}
	switch {
	case !exists && f.Subscriber != "":
		return fmt.Errorf("%w: %s owes %q nothing", ErrNotFound, what, f.Subscriber)
	case !exists:
		return fmt.Errorf("%w: %s", ErrNotFound, what)
	case n == 0 && f.Subscriber != "":
		return fmt.Errorf("%w: %s for %q", ErrNotPoisoned, what, f.Subscriber)
	case n == 0:
		return fmt.Errorf("%w: %s", ErrNotPoisoned, what)
	}
	return nil
}
