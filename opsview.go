package events

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Read-only queries for an operator's view (package eventsui): what became of
// an event's River jobs, and how fan-out went minute by minute.

// FanoutJob is one River job of an event's fanout, as River has it now.
type FanoutJob struct {
	// Subscriber is the subscriber the job was inserted for.
	Subscriber string
	// JobID is the River job's ID.
	JobID int64
	// Found is false when River no longer has the job (its own retention
	// deletes finalized jobs); the other fields are then zero.
	Found bool
	// State is River's state of the job: available, scheduled, pending,
	// running, retryable, completed, cancelled or discarded.
	State string
	// Kind is the job's kind.
	Kind string
	// Attempt is how many times River has worked the job, of MaxAttempts.
	Attempt, MaxAttempts int
	// LastError is the error of the job's last failed attempt; empty when
	// none failed.
	LastError string
	// AttemptedAt is when the job was last worked; FinalizedAt when it
	// reached a final state (completed, cancelled, discarded). Zero when
	// not (yet).
	AttemptedAt, FinalizedAt time.Time
}

// ListFanoutJobs returns the River jobs of event id's fanout with River's state
// of each, in one query joining River's job table (in the same schema) by
// job ID, ordered by subscriber. It returns none for an event not fanned
// out, or unknown.
func (o Outbox) ListFanoutJobs(ctx context.Context, db DB, id uuid.UUID) ([]FanoutJob, error) {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, sql.FanoutJobs, id)
	if err != nil {
		return nil, fmt.Errorf("events: fanout jobs %s: %w", id, err)
	}
	jobs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (FanoutJob, error) {
		var j FanoutJob
		var attempted, finalized *time.Time
		err := row.Scan(&j.Subscriber, &j.JobID, &j.Found, &j.State, &j.Kind, &j.Attempt, &j.MaxAttempts, &j.LastError,
			&attempted, &finalized)
		j.AttemptedAt, j.FinalizedAt = deref(attempted), deref(finalized)
		return j, err
	})
	if err != nil {
		return nil, fmt.Errorf("events: fanout jobs %s: %w", id, err)
	}
	return jobs, nil
}

// MinuteStats is one minute of fan-out, as [Outbox.CountFanoutByMinute] reports it.
type MinuteStats struct {
	// Minute is the minute's start.
	Minute time.Time
	// FannedOut counts the events fanned out in the minute (and not
	// poisoned since).
	FannedOut int64
	// MaxLag is the longest an event fanned out in the minute waited, from
	// its recording to its fan-out; zero when none was fanned out.
	MaxLag time.Duration
}

// CountFanoutByMinute reports fan-out minute by minute, from the minute of since
// to the current one, every minute present (zero when nothing was fanned
// out). It reads the fanned-out index over that range only; the lag needs
// each row's recording time, so a day of a busy outbox reads many rows:
// keep the range to what a chart shows. Retention bounds how far back there
// is anything to count.
func (o Outbox) CountFanoutByMinute(ctx context.Context, db DB, since time.Time) ([]MinuteStats, error) {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, sql.FanoutByMinute, since)
	if err != nil {
		return nil, fmt.Errorf("events: fanout by minute: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (MinuteStats, error) {
		var m MinuteStats
		var lag float64
		err := row.Scan(&m.Minute, &m.FannedOut, &lag)
		m.MaxLag = time.Duration(lag * float64(time.Second))
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("events: fanout by minute: %w", err)
	}
	return out, nil
}

// SubscriberDeliveries is how one subscriber's deliveries stand, as
// [Outbox.CountDeliveries] reports them.
type SubscriberDeliveries struct {
	// Subscriber is the subscriber's name.
	Subscriber string
	// Owed counts its deliveries still to be made (retrying, paused, or
	// owed to a subscriber no running relay has); OldestOwedSince is when
	// the oldest of them was first owed, zero when none is.
	Owed            int64
	OldestOwedSince time.Time
	// Poisoned counts its deliveries set aside until [Outbox.Requeue] or
	// [Outbox.Discard].
	Poisoned int64
}

// CountDeliveries counts each subscriber's owed and poisoned deliveries,
// with the age of its oldest owed one, in one query over the deliveries
// table (which holds only deliveries that still owe something: it is empty when
// every subscriber is keeping up). A subscriber with no such delivery is not in
// the map.
func (o Outbox) CountDeliveries(ctx context.Context, db DB) (map[string]SubscriberDeliveries, error) {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, sql.DeliveriesBySubscriber)
	if err != nil {
		return nil, fmt.Errorf("events: deliveries by subscriber: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (SubscriberDeliveries, error) {
		var s SubscriberDeliveries
		var oldest *time.Time
		err := row.Scan(&s.Subscriber, &s.Owed, &oldest, &s.Poisoned)
		s.OldestOwedSince = deref(oldest)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("events: deliveries by subscriber: %w", err)
	}
	out := make(map[string]SubscriberDeliveries, len(list))
	for _, s := range list {
		out[s.Subscriber] = s
	}
	return out, nil
}
