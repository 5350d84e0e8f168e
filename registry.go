package events

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/standmeet/events/internal/statements"
)

// The subscriber registry makes rolling deploys safe. While the old and the
// new release of a service run side by side, their relays know different
// subscribers. Each relay registers the subscribers it knows when it starts;
// a relay that stamps an event writes, in the event's catch_up column, the
// registered subscribers it does not know; and a relay that knows one of them
// fans the event out to it afterwards, in the catch-up lane (catchup.go).

// SubscriberInfo is a registered subscriber, as [ListSubscribers] reports it.
type SubscriberInfo struct {
	// Name is the subscriber's name.
	Name string
	// RegisteredAt is when a relay first started with it.
	RegisteredAt time.Time
	// RetiredAt is when [RetireSubscriber] retired it; zero if it is active.
	RetiredAt time.Time
}

// registerSubscribers adds the relay's subscribers to the registry (those not
// there yet) and returns the names among them that are retired.
func registerSubscribers(ctx context.Context, db DB, sql *statements.Set, names []string) ([]string, error) {
	rows, err := db.Query(ctx, sql.Register, names)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// RetireSubscriber retires a subscriber for good: relays started afterwards
// do not fan out to it even if they still have it, nothing is caught up for
// it any more (it is removed from every event's catch-up list), and its
// pending Handle jobs end as cancelled. Relays already running keep their
// subscriber set until they restart.
//
// Retire a subscriber after the last release that had it is gone from every
// process (see the README's "Deploying"). A retired name cannot be used again:
// give a revived subscriber a new name. Retiring twice is not an error; an
// unknown name returns an error wrapping [ErrUnknownSubscriber].
func RetireSubscriber(ctx context.Context, db DB, name string) error {
	return Outbox{}.RetireSubscriber(ctx, db, name)
}

// RetireSubscriber is [RetireSubscriber] in o's schema.
func (o Outbox) RetireSubscriber(ctx context.Context, db DB, name string) error {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return err
	}
	var found bool
	err = db.QueryRow(ctx, sql.Retire, name).Scan(&found)
	if err != nil {
		return fmt.Errorf("events: retire subscriber %q: %w", name, err)
	}
	if !found {
		return fmt.Errorf("%w: %q", ErrUnknownSubscriber, name)
	}
	return nil
}

// ListSubscribers lists the registered subscribers, by name.
func ListSubscribers(ctx context.Context, db DB) ([]SubscriberInfo, error) {
	return Outbox{}.ListSubscribers(ctx, db)
}

// ListSubscribers is [ListSubscribers] in o's schema.
func (o Outbox) ListSubscribers(ctx context.Context, db DB) ([]SubscriberInfo, error) {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, sql.ListSubscribers)
	if err != nil {
		return nil, fmt.Errorf("events: list subscribers: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (SubscriberInfo, error) {
		r, err := pgx.RowToStructByName[struct {
			Name         string
			RegisteredAt time.Time
			RetiredAt    *time.Time
		}](row)
		return SubscriberInfo{Name: r.Name, RegisteredAt: r.RegisteredAt, RetiredAt: deref(r.RetiredAt)}, err
	})
	if err != nil {
		return nil, fmt.Errorf("events: list subscribers: %w", err)
	}
	return list, nil
}

// deref returns *t, or the zero time for nil (a NULL column).
func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}
