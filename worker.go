package events

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// HandleArgs are the args of the River jobs the relay inserts for Handle
// subscribers. They carry the subscriber's name and the whole event, so River
// UI shows who a job is for and what it is about.
type HandleArgs struct {
	Subscriber string `json:"subscriber"`
	Event      Event  `json:"event"`
}

// Kind is the River job kind of handler jobs: "events.handle".
func (HandleArgs) Kind() string { return "events.handle" }

// AddWorkers registers the relay's River worker into workers: the worker of
// Handle subscribers' jobs. Call it before building the River
// client, in every process whose River client works the queues these jobs go
// to (a handler looks its subscriber up by name in the relay it was
// registered with, so register the same subscribers there).
func (r *Relay) AddWorkers(workers *river.Workers) error {
	if err := river.AddWorkerSafely(workers, &handleWorker{relay: r}); err != nil {
		return fmt.Errorf("events: add workers: %w", err)
	}
	return nil
}

var _ river.Worker[HandleArgs] = (*handleWorker)(nil)

type handleWorker struct {
	river.WorkerDefaults[HandleArgs]
	relay *Relay
}

// unknownSubscriberSnooze is how long a handler job waits when its
// subscriber is active but unknown in this process: during a rolling deploy,
// another process (the new release) may know it.
const unknownSubscriberSnooze = time.Minute

func (w *handleWorker) Work(ctx context.Context, job *river.Job[HandleArgs]) error {
	sub := w.relay.subscription(job.Args.Subscriber)
	// An ordered subscriber's job (tagged so by the relay that inserted it)
	// completes in its chain: the next job of its subject is released in
	// the transaction that completes it (see ordered.go).
	ordered := isOrderedJob(job.JobRow)
	schema := ""
	if ordered {
		if c, err := river.ClientFromContextSafely[pgx.Tx](ctx); err == nil {
			schema = c.Schema()
		}
	}
	if sub != nil && sub.Handle != nil {
		err := sub.Handle(ctx, job.Args.Event)
		switch {
		case !ordered:
			return err
		case err != nil:
			return settleRefusal(ctx, w.relay.pool.Begin, schema, job.JobRow, err)
		}
		return completeOrdered(ctx, w.relay.pool.Begin, schema, job.JobRow)
	}
	if sub != nil && sub.HandleTx != nil {
		// The handler's writes and the job's completion in one transaction:
		// both commit, or neither (a panic rolls back too, and River
		// recovers it).
		err := pgx.BeginFunc(ctx, w.relay.pool, func(tx pgx.Tx) error {
			if err := sub.HandleTx(ctx, tx, job.Args.Event); err != nil {
				return err
			}
			if ordered {
				if err := advanceChain(ctx, tx, schema, job.JobRow); err != nil {
					return err // refused: the handler's writes roll back too
				}
			}
			if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
				return fmt.Errorf("events: completing the job of subscriber %q: %w", job.Args.Subscriber, err)
			}
			return nil
		})
		if ordered {
			return settleRefusal(ctx, w.relay.pool.Begin, schema, job.JobRow, err)
		}
		return err
	}
	// No process may know it any more (removed and retired), or only the
	// other release does (a rolling deploy). Ask the registry.
	if c, err := river.ClientFromContextSafely[pgx.Tx](ctx); err == nil {
		schema = c.Schema()
	}
	sql, err := statementsFor(schema)
	if err != nil {
		return err
	}
	var retired bool
	err = w.relay.pool.QueryRow(ctx, sql.SubscriberRetired, job.Args.Subscriber).Scan(&retired)
	switch {
	case err != nil:
		return fmt.Errorf("events: handler job for subscriber %q: %w", job.Args.Subscriber, err)
	case retired:
		// Ends the job for good, without retrying for days.
		return river.JobCancel(fmt.Errorf("events: subscriber %q is retired", job.Args.Subscriber))
	}
	w.relay.logger.WarnContext(ctx, "events: handler job for a subscriber this process does not know; snoozing",
		slog.String("subscriber", job.Args.Subscriber), slog.Int64("job_id", job.ID), slog.Duration("snooze", unknownSubscriberSnooze))
	return river.JobSnooze(unknownSubscriberSnooze)
}
