package events

import (
	"context"
	"fmt"
	"time"
)

// backfillRange is how many seqs one BackfillSubscriber statement covers: each batch
// is one short statement over a range of the primary key.
const backfillRange = 5000

// BackfillSubscriberResult is what [Outbox.BackfillSubscriber] did.
type BackfillSubscriberResult struct {
	// Owed counts the deliveries it wrote: events now owed to the subscriber,
	// delivered by the relays that have it.
	Owed int64
	// ResumedAt is the seq it resumed after (0 for a fresh start): a
	// BackfillSubscriber of the same subscriber and since that was
	// interrupted goes on where it stopped.
	ResumedAt int64
}

// BackfillSubscriber gives a subscriber history: every retained event created at or
// after since, fanned out, matching the subscriber's types, that it has not
// got (its fanout does not name it and no delivery of it is owed or poisoned)
// is owed to it, once; the relays that have the subscriber then deliver the
// deliveries like any other. Events not yet fanned out reach it the usual way.
//
// It works in batches of 5,000 seqs, each its own statement (with a pool,
// its own transaction), and records its progress in the registry: run again
// with the same since after an interruption, it resumes; run again after it
// finished, it finds nothing more to owe. The subscriber must be active and
// registered by a relay that records its types (its types are needed): otherwise
// the error wraps [ErrUnknownSubscriber]. Progress shows as
// [Stats.Owed] and in [Outbox.ListSubscribers].
func (o Outbox) BackfillSubscriber(ctx context.Context, db DB, subscriber string, since time.Time) (BackfillSubscriberResult, error) {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return BackfillSubscriberResult{}, err
	}
	since = since.Truncate(time.Microsecond) // as PostgreSQL stores it, so a resume matches
	var (
		found, typed bool
		from, last   int64
		res          BackfillSubscriberResult
	)
	if err := db.QueryRow(ctx, sql.BackfillStart, subscriber, since).Scan(&found, &typed, &from, &last); err != nil {
		return res, fmt.Errorf("events: backfill %q: %w", subscriber, err)
	}
	switch {
	case !found:
		return res, fmt.Errorf("%w: %q (not registered, or retired)", ErrUnknownSubscriber, subscriber)
	case !typed:
		return res, fmt.Errorf("%w: %q: its types are unknown; start a relay of this version that has it first", ErrUnknownSubscriber, subscriber)
	}
	res.ResumedAt = from
	for from < last {
		to := min(from+backfillRange, last)
		var n int64
		if err := db.QueryRow(ctx, sql.BackfillBatch, subscriber, since, from, to).Scan(&found, &n, nil); err != nil {
			return res, fmt.Errorf("events: backfill %q: %w", subscriber, err)
		}
		if !found {
			return res, fmt.Errorf("%w: %q (retired during the backfill)", ErrUnknownSubscriber, subscriber)
		}
		res.Owed += n
		from = to
	}
	if _, err := db.Exec(ctx, sql.BackfillDone, subscriber, since); err != nil {
		return res, fmt.Errorf("events: backfill %q: %w", subscriber, err)
	}
	return res, nil
}
