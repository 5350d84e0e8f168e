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
// subscribers. Each relay registers the subscribers it knows, with their type
// globs, when it starts; a relay that stamps an event writes an owed delivery for
// every active registered subscriber it does not know whose types match; and
// a relay that knows it makes the delivery in the deliveries lane (internal/engine's owed.go).
// Relays record, every few seconds, which subscribers they serve
// (internal/engine's duties.go): one that no relay has served for RelayConfig.OrphanAfter is
// reported orphaned.

// SubscriberInfo is a registered subscriber, as [Outbox.ListSubscribers] reports it.
type SubscriberInfo struct {
	// Name is the subscriber's name.
	Name string
	// Types is the subscriber's type globs, as the last relay that started
	// with it registered them; empty if only relays of a release that did
	// not register types have started with it.
	Types []string
	// RegisteredAt is when a relay first started with it.
	RegisteredAt time.Time
	// RetiredAt is when [Outbox.RetireSubscriber] retired it; zero if it is active.
	RetiredAt time.Time
	// LastServedAt is when a running relay that has it last reported in
	// (see [Outbox.ListRelays]); zero if none ever did.
	LastServedAt time.Time
	// PausedAt is when [Outbox.PauseSubscriber] paused it; zero unless paused.
	PausedAt time.Time
	// BackfillSince is the since of its last [Outbox.BackfillSubscriber]; BackfillSeq how
	// far that got (by event seq); BackfillDoneAt when it finished. Zero if
	// none.
	BackfillSince  time.Time
	BackfillSeq    int64
	BackfillDoneAt time.Time
}

// registerSubscribers adds the subscribers to the registry (those not there
// yet), records their type globs, and returns the names among them that
// are retired. A nil subs entry registers a name with unknown types (every
// event is owed to it): tests use it for another release's subscriber.
func registerSubscribers(ctx context.Context, db DB, sql *statements.Set, names []string, subs ...*subscription) ([]string, error) {
	types := make([]*string, len(names))
	res := make([]*string, len(names))
	for i := range names {
		if i < len(subs) && subs[i] != nil {
			t, re := subs[i].registryTypes()
			types[i], res[i] = &t, &re
		}
	}
	rows, err := db.Query(ctx, sql.Register, names, types, res)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// RetireSubscriber retires a subscriber for good: relays started afterwards
// do not fan out to it even if they still have it, no delivery is owed to
// it any more (its owed and poisoned deliveries are deleted, in batches of
// 1,000, after the retirement commits; no stamp in flight can write it
// back), its pending Handle jobs end as cancelled, and the relays' sweep
// releases its ordered chains. Relays already running keep
// delivering new events to it until they restart, but owe it nothing. With
// db a transaction, all of it happens in that transaction.
//
// Retire a subscriber after the last release that had it is gone from every
// process (see the README's "Deploying"). A retired name cannot be used again:
// give a revived subscriber a new name. Retiring twice is not an error; an
// unknown name returns an error wrapping [ErrUnknownSubscriber].
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
	// Committed (with a pool): no stamp can write the name any more, since
	// every stamp reads the registry row FOR KEY SHARE and Retire's FOR
	// UPDATE waited for those in flight. What is still owed to it goes, in
	// bounded batches.
	for _, stmt := range []string{sql.RetireDeliveries, sql.RetireCatchUp} {
		for {
			var n int64
			if err := db.QueryRow(ctx, stmt, name, retireBatch).Scan(&n); err != nil {
				return fmt.Errorf("events: retire subscriber %q: %w", name, err)
			}
			if n < retireBatch {
				break
			}
		}
	}
	return nil
}

// retireBatch is how many owed deliveries (or catch_up lists) one statement of
// RetireSubscriber clears.
const retireBatch = 1000

// ListSubscribers lists the registered subscribers, by name.
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
			Name           string
			RegisteredAt   time.Time
			RetiredAt      *time.Time
			Types          []string
			LastServedAt   *time.Time
			PausedAt       *time.Time
			BackfillSince  *time.Time
			BackfillSeq    int64
			BackfillDoneAt *time.Time
		}](row)
		return SubscriberInfo{Name: r.Name, Types: r.Types, RegisteredAt: r.RegisteredAt, RetiredAt: deref(r.RetiredAt),
			LastServedAt: deref(r.LastServedAt), PausedAt: deref(r.PausedAt), BackfillSince: deref(r.BackfillSince),
			BackfillSeq: r.BackfillSeq, BackfillDoneAt: deref(r.BackfillDoneAt)}, err
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
