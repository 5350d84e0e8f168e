package events

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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
func registerSubscribers(ctx context.Context, db DB, schema string, names []string) ([]string, error) {
	t := qualify(schema, subscribersTable)
	rows, err := db.Query(ctx, `WITH ins AS (
			INSERT INTO `+t+` (name) SELECT unnest($1::text[]) ON CONFLICT (name) DO NOTHING)
		SELECT name FROM `+t+` WHERE name = ANY($1::text[]) AND retired_at IS NOT NULL ORDER BY name`, names)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// subscribersTable is the registry, unqualified.
const subscribersTable = "outbox_subscribers"

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
	if err := validateSchema(o.Schema); err != nil {
		return err
	}
	var found bool
	err := db.QueryRow(ctx, `WITH r AS (
			UPDATE `+qualify(o.Schema, subscribersTable)+` SET retired_at = coalesce(retired_at, now())
			 WHERE name = $1 RETURNING name),
		c AS (
			UPDATE `+qualify(o.Schema, tableName)+` SET catch_up = nullif(array_remove(catch_up, $1), '{}')
			 WHERE catch_up @> ARRAY[$1]::text[] AND EXISTS (SELECT 1 FROM r))
		SELECT EXISTS (SELECT 1 FROM r)`, name).Scan(&found)
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
	if err := validateSchema(o.Schema); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, "SELECT name, registered_at, retired_at FROM "+
		qualify(o.Schema, subscribersTable)+" ORDER BY name")
	if err != nil {
		return nil, fmt.Errorf("events: list subscribers: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (SubscriberInfo, error) {
		var s SubscriberInfo
		var retired *time.Time
		err := row.Scan(&s.Name, &s.RegisteredAt, &retired)
		if retired != nil {
			s.RetiredAt = *retired
		}
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("events: list subscribers: %w", err)
	}
	return list, nil
}
