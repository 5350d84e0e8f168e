package events

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/standmeet/events/internal/groupbatch"
	"github.com/standmeet/events/internal/logging"
	"github.com/standmeet/events/internal/statements"
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
// the jobs of its Handle and HandleTx subscribers. Call it before building
// the River client. It is [Outbox.AddWorkers] with the relay's pool and
// subscribers (those subscribed later too).
func (r *Relay) AddWorkers(workers *river.Workers) error {
	return addHandleWorker(workers, newHandleWorker(r.pool, r.sql, r.logger, r.subscription))
}

// AddWorkers registers into workers the worker of the jobs of the Handle
// and HandleTx subscribers among subscribers, for a process that works the
// queues these jobs go to but runs no relay: every process whose River
// client works them needs the same subscribers, registered here or on its
// relay ([Relay.AddWorkers]). HandleTx transactions begin on pool. A
// subscriber that could not be registered on a relay is refused the same
// way: an error wrapping [ErrInvalidSubscriber] naming the field. A job of a
// subscriber this process does not know waits (see [Subscriber]). o.Schema
// must be the River client's (river.Config.Schema): a job of an unknown
// subscriber fails, naming both, when they differ.
func (o Outbox) AddWorkers(workers *river.Workers, pool *pgxpool.Pool, subscribers ...Subscriber) error {
	if pool == nil {
		return invalidf(ErrInvalidConfig, "pool", "is nil")
	}
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return err
	}
	byName := make(map[string]*subscription, len(subscribers))
	for _, s := range subscribers {
		sub, err := newSubscription(s)
		if err != nil {
			return err
		}
		if byName[s.Name] != nil {
			return invalidf(ErrInvalidSubscriber, "Name", "%q is already registered", s.Name)
		}
		byName[s.Name] = sub
	}
	lookup := func(name string) *subscription { return byName[name] }
	return addHandleWorker(workers, newHandleWorker(pool, sql, logging.Default(), lookup))
}

func addHandleWorker(workers *river.Workers, w *handleWorker) error {
	if err := river.AddWorkerSafely(workers, w); err != nil {
		// River takes one worker per kind: the subscribers of a second call
		// would never be looked up, so say where they all go.
		return fmt.Errorf("events: add workers: %w: a process registers its Handle and HandleTx subscribers once, "+
			"all on its relay (Relay.AddWorkers) or all with Outbox.AddWorkers", err)
	}
	return nil
}

var _ river.Worker[HandleArgs] = (*handleWorker)(nil)

// handleWorker works the jobs of Handle and HandleTx subscribers, looking
// each job's subscriber up by name.
type handleWorker struct {
	river.WorkerDefaults[HandleArgs]
	pool   *pgxpool.Pool
	sql    *statements.Set
	logger *slog.Logger
	lookup func(name string) *subscription
	// chains batches the chain statements (completions, turn checks) of
	// the workers running ordered Handle jobs at the same moment.
	chains *groupbatch.Batcher
}

// Chain statements batched together: at most chainBatchMax per batch,
// chainBatchLanes batches at once, each within chainBatchTimeout. A batch
// is one transaction: it holds the row lock of every chain it completes
// in until it commits, and a relay's round appending to any of them waits
// for it (then the completions wait for the round). Ten at a time keeps
// most of what batching saves (a round trip and a commit for ten
// completions) and lets the rounds through: with 100 a batch held half the
// benchmark's 100 chains at once, and the relay fanned out ordered events
// at a third of its rate while workers ran (20,000 events over 100
// subjects handled in 6.5–9.7 s against 5.0–5.3 s with 10, alternating
// runs; unordered 3.1–3.7 s).
const (
	chainBatchMax     = 10
	chainBatchLanes   = 1
	chainBatchTimeout = 30 * time.Second
)

func newHandleWorker(pool *pgxpool.Pool, sql *statements.Set, logger *slog.Logger, lookup func(string) *subscription) *handleWorker {
	return &handleWorker{pool: pool, sql: sql, logger: logger, lookup: lookup,
		chains: groupbatch.New(pool, chainBatchMax, chainBatchLanes, chainBatchTimeout)}
}

// jobContextKey carries the River job a handler runs in its context.
type jobContextKey struct{}

// JobFromContext returns the River job that a Handle or HandleTx handler
// runs, from the handler's ctx; nil elsewhere. An ordered subscriber's
// worker runs the jobs waiting behind the one River gave it (see
// [Subscriber.Ordered]): those jobs are not River's to start, so River's
// worker middleware sees only the first, and this is how a handler knows
// which job it runs (its ID, its attempt).
func JobFromContext(ctx context.Context) *rivertype.JobRow {
	job, _ := ctx.Value(jobContextKey{}).(*rivertype.JobRow)
	return job
}

func withJob(ctx context.Context, job *rivertype.JobRow) context.Context {
	return context.WithValue(ctx, jobContextKey{}, job)
}

// unknownSubscriberSnooze is how long a handler job waits when its
// subscriber is active but unknown in this process: during a rolling deploy,
// another process (the new release) may know it.
const unknownSubscriberSnooze = time.Minute

func (w *handleWorker) Work(ctx context.Context, job *river.Job[HandleArgs]) error {
	sub := w.lookup(job.Args.Subscriber)
	// An ordered subscriber's job (tagged so by the relay that inserted it)
	// completes in its chain, and the worker runs on with the jobs waiting
	// behind it (runChain, ordered.go). One the previous release tagged
	// though its event had no subject is in no chain: its completion finds
	// none and completes it as an unordered job.
	if sub != nil && isOrderedJob(job.JobRow) && (sub.Handle != nil || sub.HandleTx != nil) {
		return w.runChain(ctx, sub, job.JobRow, job.Args.Event)
	}
	ctx = withJob(ctx, job.JobRow)
	if sub != nil && sub.Handle != nil {
		return sub.Handle(ctx, job.Args.Event)
	}
	if sub != nil && sub.HandleTx != nil {
		// The handler's writes and the job's completion in one transaction:
		// both commit, or neither (a panic rolls back too, and River
		// recovers it).
		// Every run is fenced on its attempt: a run that outlived its rescue
		// (River gave the job to another worker) commits nothing.
		err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
			if err := sub.HandleTx(ctx, tx, job.Args.Event); err != nil {
				return err
			}
			if err := fenceJob(ctx, tx, w.sql, job.JobRow); err != nil {
				return err // refused: the handler's writes roll back too
			}
			if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
				return fmt.Errorf("events: completing the job of subscriber %q: %w", job.Args.Subscriber, err)
			}
			return nil
		})
		return settleRefusal(ctx, w.pool.Begin, w.sql, job.JobRow, err)
	}
	// No process may know it any more (removed and retired), or only the
	// other release does (a rolling deploy). Ask the registry — the one of
	// the job's schema: a worker-only process has no relay to check its
	// Outbox against its River client, and another schema's registry would
	// not have the name and so cancel a live subscriber's job for good.
	if client, err := river.ClientFromContextSafely[pgx.Tx](ctx); err == nil && client.Schema() != w.sql.Schema {
		return fmt.Errorf("events: handler job for subscriber %q: the River client's schema is %q, the Outbox's %q: name the same schema in both",
			job.Args.Subscriber, client.Schema(), w.sql.Schema)
	}
	var retired bool
	err := w.pool.QueryRow(ctx, w.sql.SubscriberRetired, job.Args.Subscriber).Scan(&retired)
	switch {
	case err != nil:
		return fmt.Errorf("events: handler job for subscriber %q: %w", job.Args.Subscriber, err)
	case retired:
		// Ends the job for good, without retrying for days.
		return river.JobCancel(fmt.Errorf("events: subscriber %q is retired", job.Args.Subscriber))
	}
	w.logger.WarnContext(ctx, "events: handler job for a subscriber this process does not know; snoozing",
		slog.String("subscriber", job.Args.Subscriber), slog.Int64("job_id", job.ID), slog.Duration("snooze", unknownSubscriberSnooze))
	return river.JobSnooze(unknownSubscriberSnooze)
}
