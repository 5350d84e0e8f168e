package events

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/standmeet/events/internal/dbutil"
	"github.com/standmeet/events/internal/engine"
	"github.com/standmeet/events/internal/groupbatch"
	"github.com/standmeet/events/internal/statements"
)

// Ordered subscribers. For a subscriber with Ordered set, the jobs of one
// subject form a chain: still one River job per (event, subscriber), so
// River's retries, UI and metrics apply, but only the chain's head is
// released; the jobs behind it are inserted in River's pending state, and
// the next one is released in the transaction that completes the head
// (outbox_chain_advance, migration 008).
//
// The order is the order in which relays append jobs to the chain: a round
// appends in the transaction that stamps the events, under the chain's row
// lock (taken by the stamp, or, for a coalescing subscriber, by the round's
// prepare), and a round never appends an event while an earlier
// event of the subject is still owed to the subscriber elsewhere (not yet
// fanned out, or an owed pair): it waits briefly for a round that is fanning
// that event out, and otherwise defers its own (owes it as a pair, retried
// shortly). So when the producers of a subject serialise their writes
// (they lock the same row), the chain's order is their commit order.

// OrderedDiscard is what an ordered subscriber's chain does when its head's
// River job is discarded (its attempts spent) or cancelled, or deleted from
// River: see [Subscriber.OrderedOnDiscard].
type OrderedDiscard int

const (
	// OrderedBlock stops the subject's chain: the jobs behind the head wait
	// (River's pending state) until an operator resumes the chain (the head
	// is retried) or skips the head ([Outbox.ResumeChain],
	// [Outbox.SkipChain], `events chains`, the web view). Other subjects
	// flow. The default.
	OrderedBlock OrderedDiscard = iota
	// OrderedContinue moves the chain on to the next job; the head's job
	// stays in River as River ended it.
	OrderedContinue
)

// String returns "block" or "continue".
func (d OrderedDiscard) String() string {
	switch d {
	case OrderedBlock:
		return "block"
	case OrderedContinue:
		return "continue"
	}
	return fmt.Sprintf("OrderedDiscard(%d)", int(d))
}

// tagOrdered marks the jobs of ordered subscribers (package engine).
const tagOrdered = engine.TagOrdered

// Timings of ordered subscribers' workers.
const (
	// outOfTurnSnooze is how long a job that was started before its turn
	// (retried by hand while pending) waits before it runs again.
	outOfTurnSnooze = time.Second
	// fencedPoll is how often a fenced worker looks whether the run that
	// superseded it has finished.
	fencedPoll = 50 * time.Millisecond
)

// validateOrdered checks the ordered fields of a subscriber.
func validateOrdered(s Subscriber, bad func(field, msg string, args ...any) error) error {
	switch {
	case s.OrderedOnDiscard != OrderedBlock && s.OrderedOnDiscard != OrderedContinue:
		return bad("OrderedOnDiscard", "%v: use OrderedBlock or OrderedContinue", s.OrderedOnDiscard)
	case s.OrderedOnDiscard != OrderedBlock && !s.Ordered:
		return bad("OrderedOnDiscard", "is set, but Ordered is not")
	}
	return nil
}

// chainRefusal is a completion of an ordered job that its chain refused.
type chainRefusal struct {
	jobID   int64
	attempt int
	outcome string
}

func (e *chainRefusal) Error() string {
	switch e.outcome {
	case "waiting":
		return fmt.Sprintf("events: ordered job %d ran before its turn (retried by hand while pending?): not completed, it waits for its turn", e.jobID)
	}
	return fmt.Sprintf("events: job %d, attempt %d, was superseded (River gave the job to another worker, or it was finished meanwhile): its completion is refused (and its chain, if any, left alone)", e.jobID, e.attempt)
}

// advanceChain moves job's chain on, inside tx, in which the caller
// completes job: a compare-and-set on the chain's head and on River running
// the job in job.Attempt. A refusal is a *chainRefusal; tx must then be
// rolled back.
func advanceChain(ctx context.Context, tx pgx.Tx, sql *statements.Set, job *rivertype.JobRow) error {
	var outcome string
	if err := tx.QueryRow(ctx, sql.Ordered.ChainAdvance, job.ID, job.Attempt, dbutil.NilIfEmpty(sql.Schema)).Scan(&outcome, nil); err != nil {
		return fmt.Errorf("events: moving the chain of job %d on: %w", job.ID, err)
	}
	switch outcome {
	case "advanced":
	case "gone":
		// In no chain (any more): its subscriber is no longer ordered and
		// its chain was released, or an operator skipped it and retried it
		// by hand. Nothing to move on: it completes as an unordered job —
		// fenced all the same, so a zombie of it completes nothing.
		return fenceJob(ctx, tx, sql, job)
	default:
		return &chainRefusal{jobID: job.ID, attempt: job.Attempt, outcome: outcome}
	}
	return nil
}

// fenceJob refuses, inside tx, in which the caller completes job, a run
// that River no longer runs in job.Attempt (a zombie: River rescued the
// job and gave it to another worker, or it was finished meanwhile): a
// *chainRefusal "fenced", and tx must be rolled back. The job's row stays
// locked until tx ends, so no rescue slips in between.
func fenceJob(ctx context.Context, tx pgx.Tx, sql *statements.Set, job *rivertype.JobRow) error {
	var running bool
	if err := tx.QueryRow(ctx, sql.Ordered.JobFence, job.ID, job.Attempt).Scan(&running); err != nil {
		return fmt.Errorf("events: fencing job %d: %w", job.ID, err)
	}
	if !running {
		return &chainRefusal{jobID: job.ID, attempt: job.Attempt, outcome: "fenced"}
	}
	return nil
}

// isOrderedJob reports whether job belongs to a chain.
func isOrderedJob(job *rivertype.JobRow) bool { return slices.Contains(job.Tags, tagOrdered) }

// orderedArgs stands for any job's args where River's JobCompleteTx wants a
// typed job: it decodes whatever the args are.
type orderedArgs struct{ json.RawMessage }

func (orderedArgs) Kind() string { return "" }

// beginFunc begins a transaction: on the relay's pool, or on the River
// client's driver.
type beginFunc func(ctx context.Context) (pgx.Tx, error)

// completeInChain completes an ordered job whose handler succeeded, in a
// transaction of its own that also moves its chain on (releasing the next
// job), so that a crash does neither or both: OrderedMiddleware's
// completion. A refusal is a *chainRefusal.
func completeInChain(ctx context.Context, begin beginFunc, sql *statements.Set, job *rivertype.JobRow) error {
	tx, err := begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := advanceChain(ctx, tx, sql, job); err != nil {
		return err
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, &river.Job[orderedArgs]{JobRow: job}); err != nil {
		return fmt.Errorf("events: completing ordered job %d: %w", job.ID, err)
	}
	return tx.Commit(ctx)
}

// Running on in a chain: River gives a worker the head of a chain; once
// its handler succeeds, the statement that completes it takes the jobs
// waiting right behind it (outbox_chain_complete, migration 012), and the
// worker runs those at once, in chain order, and completes them together in
// the statement that takes the next ones, and so on: a subject's waiting
// events cost one statement per batch, not four round trips and a River
// fetch each.
const (
	// chainRunFor bounds how long a worker runs on in the chain River gave
	// it (and at most half the job's timeout): then it releases the next
	// job for River's fetch, so that River's stop and its other queues'
	// jobs do not wait on a long chain.
	chainRunFor = time.Second
	// chainTake is how many waiting jobs a completion takes at most.
	chainTake = 50
	// riverMaxAttemptedBy is River's cap on a job's attempted_by (its
	// producer's maxAttemptedBy, v0.51.2), kept when a completion takes
	// jobs as River's fetch would.
	riverMaxAttemptedBy = 100
	// handBackTimeout bounds giving taken jobs back to River, retried
	// every handBackRetry.
	handBackTimeout = 10 * time.Second
	handBackRetry   = 100 * time.Millisecond
)

// runChain runs job, an ordered Handle or HandleTx subscriber's that River
// gave this worker, and then the jobs of its chain that its completion
// takes. The taken jobs run one at a time, in chain order, on this worker:
// still one handler at a time per subject. They complete together, fenced
// like the first on the chain's head and on each job's attempt. When a
// taken job's handler fails (or panics), the jobs not completed go back to
// River (handBack): the failed one with its attempt counted and its error
// recorded, as River records a failed attempt (River runs it again at once,
// then with its own retries), the others as they were before they were
// taken. HandleTx runs a batch in one transaction: a failure rolls the
// whole batch back. The job River gave is done by then; its outcome is
// what runChain returns.
func (w *handleWorker) runChain(ctx context.Context, sub *subscription, job *rivertype.JobRow, e Event) error {
	var takeBy *string
	if client, err := river.ClientFromContextSafely[pgx.Tx](ctx); err == nil {
		id := client.ID()
		takeBy = &id
	}
	// Taking ends after chainRunFor; a taken job starts no later than
	// twice that, and never past the job's deadline (River's JobTimeout):
	// River's rescuer gives a job to another worker only once it has run
	// for RescueStuckJobsAfter, which River keeps at least JobTimeout, so
	// a worker that hung (a zombie) and woke up gives the rest back rather
	// than run a later event of its subject beside the live run.
	now := time.Now()
	until, stopBy := now.Add(chainRunFor), now.Add(2*chainRunFor)
	if d, ok := ctx.Deadline(); ok {
		until, stopBy = minTime(until, now.Add(time.Until(d)/2)), minTime(stopBy, d)
	}
	by := func() *string {
		if time.Now().Before(until) && ctx.Err() == nil {
			return takeBy
		}
		return nil
	}
	// A job River started before its turn (given back to River while jobs
	// before it wait) waits for it without running its handler.
	var early bool
	if err := w.chains.Do(ctx, &groupbatch.Item{Key: chainKeyOf(sub, e), SQL: w.sql.Ordered.ChainOutOfTurn, Args: []any{job.ID},
		Scan: func(rows pgx.Rows) error {
			early = false
			for rows.Next() {
				if err := rows.Scan(&early); err != nil {
					return err
				}
			}
			return nil
		}}); err != nil {
		return fmt.Errorf("events: ordered job %d: %w", job.ID, err)
	}
	if early {
		return river.JobSnooze(outOfTurnSnooze)
	}
	batch, err := w.runBatch(ctx, sub, []*rivertype.JobRow{job}, []Event{e}, by(), time.Time{})
	if err != nil {
		return settleRefusal(ctx, w.pool.Begin, w.sql, job, err)
	}
	for len(batch) > 0 {
		evs := make([]Event, len(batch))
		for i, j := range batch {
			var args HandleArgs
			err := json.Unmarshal(j.EncodedArgs, &args)
			if err == nil && args.Subscriber != sub.Name {
				err = fmt.Errorf("its subscriber is %q", args.Subscriber)
			}
			if err != nil {
				w.handBack(ctx, sub, batch, nil, fmt.Errorf("events: job %d is not a handler job of subscriber %q: %w", j.ID, sub.Name, err))
				return nil
			}
			evs[i] = args.Event
		}
		if batch, err = w.runBatch(ctx, sub, batch, evs, by(), stopBy); err != nil {
			return nil // given back
		}
	}
	return nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// errRunOnStale stops a worker from starting a taken job after stopBy.
var errRunOnStale = errors.New("events: the worker ran on in its chain for too long: gave the jobs it took back to River")

// runBatch runs jobs (a chain's head, then the jobs behind it) with their
// events es, and completes them in their chain, taking the next jobs by
// takeBy (nil: releasing the next). Taken jobs (stopBy set) start only
// before stopBy. For them, a failure gives back the jobs not completed (see
// runChain) and is returned; a panic is a failure (River recovers only the
// panics of the job it gave).
func (w *handleWorker) runBatch(ctx context.Context, sub *subscription, jobs []*rivertype.JobRow, es []Event, takeBy *string, stopBy time.Time) (next []*rivertype.JobRow, err error) {
	taken := !stopBy.IsZero()
	done, failed := 0, -1 // jobs that ran to the end; the job whose handler failed
	start := func(i int) error {
		if taken && !time.Now().Before(stopBy) {
			failed = -1
			return errRunOnStale
		}
		failed = i
		return nil
	}
	if taken {
		defer func() {
			if p := recover(); p != nil {
				err = engine.PanicError(fmt.Sprintf("subscriber %q's handler", sub.Name), p)
			}
			if err == nil {
				return
			}
			next = nil
			var failedID *int64
			if failed >= 0 {
				failedID = &jobs[failed].ID
			}
			w.handBack(ctx, sub, jobs[done:], failedID, err)
			if done > 0 {
				w.completeRan(ctx, chainKeyOf(sub, es[0]), jobs[:done])
			}
		}()
	}
	if sub.Handle != nil {
		for i, e := range es {
			done = i // jobs[:i] ran: completed if a later one fails
			if err := start(i); err != nil {
				return nil, err
			}
			if err := sub.Handle(withJob(ctx, jobs[i]), e); err != nil {
				return nil, err
			}
		}
		failed, done = -1, len(es)
		next, err := completeAndTake(ctx, w.chains.Do, w.sql, chainKeyOf(sub, es[0]), jobs, takeBy)
		if err != nil {
			done = 0 // not completed: given back, not counted
		}
		return next, err
	}
	// The handlers' writes, the completions and the take commit together,
	// or none of them.
	err = pgx.BeginTxFunc(ctx, w.pool, engine.OwnTx, func(tx pgx.Tx) error {
		for i, e := range es {
			if err := start(i); err != nil {
				return err
			}
			if err := sub.HandleTx(withJob(ctx, jobs[i]), tx, e); err != nil {
				return err
			}
		}
		failed = -1
		next, err = completeAndTake(ctx, alone(tx), w.sql, chainKeyOf(sub, es[0]), jobs, takeBy)
		return err
	})
	if err != nil {
		return nil, err
	}
	done = len(jobs)
	return next, nil
}

// completeAndTake completes jobs, of the chain key, in their chain
// (ChainComplete) by run, and returns the next jobs of the chain if takeBy
// took them, none if the next was released (or the chain is empty). A
// refusal is a *chainRefusal, and nothing is done.
func completeAndTake(ctx context.Context, run runStatement, sql *statements.Set, key string, jobs []*rivertype.JobRow, takeBy *string) ([]*rivertype.JobRow, error) {
	ids, attempts := idsAndAttempts(jobs)
	var (
		outcome string
		next    []*rivertype.JobRow
	)
	scan := func(rows pgx.Rows) error {
		outcome, next = "", nil
		now := time.Now()
		for rows.Next() {
			var (
				id, attempt, maxAttempts *int64
				args                     []byte
				tags                     []string
				queue                    *string
			)
			if err := rows.Scan(&outcome, &id, &attempt, &args, &tags, &maxAttempts, &queue); err != nil {
				return err
			}
			if id != nil {
				next = append(next, &rivertype.JobRow{ID: *id, Attempt: int(*attempt), AttemptedAt: &now, EncodedArgs: args, Kind: jobs[0].Kind,
					MaxAttempts: int(*maxAttempts), Queue: *queue, State: rivertype.JobStateRunning, Tags: tags})
			}
		}
		return nil
	}
	if err := run(ctx, &groupbatch.Item{Key: key, SQL: sql.Ordered.ChainComplete,
		Args: []any{ids, attempts, dbutil.NilIfEmpty(sql.Schema), takeBy, chainTake, riverMaxAttemptedBy}, Scan: scan}); err != nil {
		return nil, fmt.Errorf("events: completing ordered job %d: %w", ids[0], err)
	}
	switch outcome {
	case "advanced", "completed":
	default:
		return nil, &chainRefusal{jobID: ids[0], attempt: jobs[0].Attempt, outcome: outcome}
	}
	return next, nil
}

// runStatement runs a chain statement: alone, or batched with other
// workers' (handleWorker.chains).
type runStatement func(context.Context, *groupbatch.Item) error

// alone runs a chain statement alone on q (a HandleTx handler's
// transaction, whose writes commit with it).
func alone(q groupbatch.Querier) runStatement {
	return func(ctx context.Context, it *groupbatch.Item) error { return groupbatch.Run(ctx, q, it) }
}

// chainKeyOf is the key that orders, in a batch of chain statements, the
// statements of e's chain for sub, so that a batch locks chains in the
// order a relay's round does: a coalescing subscriber's first (its
// prepare locks them), then the others (its stamp), each by subscriber,
// then subject.
func chainKeyOf(sub *subscription, e Event) string {
	group := "1"
	if sub.Coalesce {
		group = "0"
	}
	return group + sub.Name + "\x00" + e.Subject
}

// completeRan completes, after a later job of their batch failed, the
// taken jobs whose handlers succeeded (releasing the next), retried like
// handBack.
func (w *handleWorker) completeRan(ctx context.Context, key string, jobs []*rivertype.JobRow) {
	err := retryBriefly(ctx, func(ctx context.Context) error {
		_, err := completeAndTake(ctx, w.chains.Do, w.sql, key, jobs, nil)
		if ref := (*chainRefusal)(nil); errors.As(err, &ref) {
			return nil // not ours to complete any more
		}
		return err
	})
	if err != nil {
		w.logger.ErrorContext(ctx, "events: completing ordered jobs run on in their chain failed", slog.String("err", err.Error()))
	}
}

// retryBriefly runs f until it succeeds or handBackTimeout passes (even
// once ctx is cancelled: what it does must not be left half done), every
// handBackRetry, and returns its last error. f must be idempotent.
func retryBriefly(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handBackTimeout)
	defer cancel()
	for {
		err := f(ctx)
		if err == nil {
			return nil
		}
		t := time.NewTimer(handBackRetry)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
	}
}

// idsAndAttempts returns jobs' IDs and attempts, as the chain statements
// take them.
func idsAndAttempts(jobs []*rivertype.JobRow) ([]int64, []int32) {
	ids, attempts := make([]int64, len(jobs)), make([]int32, len(jobs))
	for i, j := range jobs {
		ids[i], attempts[i] = j.ID, int32(j.Attempt)
	}
	return ids, attempts
}

// handBack gives taken jobs that did not run to the end back to River
// (ChainHandBack): the one whose handler failed (failed, or nil) with its
// attempt counted and cause recorded, the others not counted; the chain's
// head available. A job no longer running in its attempt is left alone.
func (w *handleWorker) handBack(ctx context.Context, sub *subscription, jobs []*rivertype.JobRow, failed *int64, cause error) {
	if len(jobs) == 0 {
		return
	}
	ids, attempts := idsAndAttempts(jobs)
	attrs := []any{slog.String("subscriber", sub.Name), slog.Int64("job_id", ids[0]), slog.Int("jobs", len(ids)), slog.String("err", cause.Error())}
	// It changes only jobs still running in their attempt. Taken jobs left
	// running under a live client would wait for River's rescuer.
	if err := retryBriefly(ctx, func(ctx context.Context) error {
		_, err := w.pool.Exec(ctx, w.sql.Ordered.ChainHandBack, ids, attempts, dbutil.NilIfEmpty(w.sql.Schema), failed, cause.Error())
		return err
	}); err != nil {
		w.logger.ErrorContext(ctx, "events: ordered jobs run on in their chain failed, and giving them back to River failed too: River rescues them",
			append(attrs, slog.String("hand_back_err", err.Error()))...)
		return
	}
	w.logger.WarnContext(ctx, "events: an ordered job run on in its chain failed: gave it back to River", attrs...)
}

// advanceSelfCompleted moves on the chain of a job that its worker
// completed itself, in its own transaction (river.JobCompleteTx, River's
// transactional pattern), in this very attempt: the completion is done, only
// the chain is left. It reports whether that was the case. A zombie's
// attempt is not the one River completed, so it moves nothing.
func advanceSelfCompleted(ctx context.Context, begin beginFunc, sql *statements.Set, job *rivertype.JobRow) (bool, error) {
	tx, err := begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var (
		state   string
		attempt int
	)
	if err := tx.QueryRow(ctx, sql.Ordered.JobState, job.ID).Scan(&state, &attempt); err != nil {
		return false, err
	}
	if state != string(rivertype.JobStateCompleted) || attempt != job.Attempt {
		return false, nil
	}
	var outcome string
	if err := tx.QueryRow(ctx, sql.Ordered.ChainAdvance, job.ID, nil, dbutil.NilIfEmpty(sql.Schema)).Scan(&outcome, nil); err != nil {
		return false, fmt.Errorf("events: moving the chain of job %d on: %w", job.ID, err)
	}
	return true, tx.Commit(ctx)
}

// settleRefusal turns a refused completion into what the worker returns to
// River: a job that ran out of turn is snoozed; a superseded one (a zombie:
// River rescued its job and gave it to another worker) returns the refusal
// once the run that superseded it has finished (see settleSuperseded). Other errors pass, after the same
// wait: a zombie's failure must not end the live run's job either.
func settleRefusal(ctx context.Context, begin beginFunc, sql *statements.Set, job *rivertype.JobRow, err error) error {
	var ref *chainRefusal
	if !errors.As(err, &ref) {
		if err != nil {
			settleSuperseded(ctx, begin, sql, job)
		}
		return err
	}
	switch ref.outcome {
	case "waiting":
		return river.JobSnooze(outOfTurnSnooze)
	}
	settleSuperseded(ctx, begin, sql, job)
	return ref
}

// settleSuperseded waits, within ctx, while River runs job in a later
// attempt than this worker's: this worker is a zombie. River records a
// worker's outcome on the job's row whichever run it came from (its
// completer does not compare attempts), so a zombie returning at once would
// end the live run's job under it (retryable, or completed); returning once
// that run is over, the zombie's outcome meets a job no longer running and
// changes nothing. A worker whose job is still its own returns at once,
// after one query.
func settleSuperseded(ctx context.Context, begin beginFunc, sql *statements.Set, job *rivertype.JobRow) {
	for ctx.Err() == nil {
		var (
			state   string
			attempt int
		)
		qerr := func() error {
			tx, err := begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			return tx.QueryRow(ctx, sql.Ordered.JobState, job.ID).Scan(&state, &attempt)
		}()
		if qerr != nil || state != string(rivertype.JobStateRunning) || attempt <= job.Attempt {
			return
		}
		t := time.NewTimer(fencedPoll)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
}

// OrderedMiddleware completes the jobs of ordered [Subscriber.Map]
// subscribers in their chain: after the host's worker returns nil, it
// completes the job (river.JobCompleteTx) in a transaction that also
// releases the next job of the subject, fenced on the chain's head and on
// the job's attempt, as the library's own worker does for Handle and
// HandleTx. A worker that completed its job itself (river.JobCompleteTx in
// its own transaction) may: the middleware then only releases the next.
// List it in river.Config.Middleware of every River client that works an
// ordered Map subscriber's jobs; it leaves every other job alone.
// Without it such a job completes as usual and its chain moves on only at
// the relays' next sweep (about a second), with a warning.
type OrderedMiddleware struct {
	river.MiddlewareDefaults
}

var _ rivertype.WorkerMiddleware = (*OrderedMiddleware)(nil)

// Work runs the job and, for an ordered Map subscriber's job that
// succeeded, completes it in its chain.
func (*OrderedMiddleware) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	if job.Kind == (HandleArgs{}).Kind() || !isOrderedJob(job) {
		return doInner(ctx)
	}
	workErr := doInner(ctx)
	client, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return errors.Join(workErr, fmt.Errorf("events: OrderedMiddleware: %w", err))
	}
	driver := client.Driver()
	begin := func(ctx context.Context) (pgx.Tx, error) {
		etx, err := driver.GetExecutor().Begin(ctx)
		if err != nil {
			return nil, err
		}
		tx := driver.UnwrapTx(etx)
		// READ COMMITTED, as engine.OwnTx: the completion locks the chain's row,
		// which a round may write meanwhile.
		if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"); err != nil {
			_ = tx.Rollback(ctx)
			return nil, err
		}
		return tx, nil
	}
	sql, err := statementsFor(client.Schema())
	if err != nil {
		return errors.Join(workErr, err)
	}
	if workErr != nil {
		return settleRefusal(ctx, begin, sql, job, workErr)
	}
	err = completeInChain(ctx, begin, sql, job)
	var ref *chainRefusal
	if errors.As(err, &ref) && ref.outcome == "fenced" {
		// Not running any more: perhaps the worker completed the job
		// itself (river.JobCompleteTx in its own transaction).
		if done, serr := advanceSelfCompleted(ctx, begin, sql, job); serr == nil && done {
			return nil
		}
	}
	return settleRefusal(ctx, begin, sql, job, err)
}

// ChainInfo is one ordered subscriber's chain of one subject — its jobs not
// yet finished — as [Outbox.ListChains] reports it.
type ChainInfo struct {
	Subscriber, Subject string
	// HeadJobID is the River job at the chain's head: the one released (or
	// blocked); the others wait behind it in River's pending state.
	HeadJobID int64
	// HeadEventID, HeadEventSeq and HeadEventType are the event the head's
	// job carries.
	HeadEventID   uuid.UUID
	HeadEventSeq  int64
	HeadEventType string
	// Jobs counts the chain's jobs, the head's included.
	Jobs int64
	// HeadState is River's state of the head's job (available, running,
	// retryable, discarded, …); empty when River no longer has it. Attempt
	// and MaxAttempts are its attempts, LastError its last attempt's error.
	HeadState            string
	Attempt, MaxAttempts int
	LastError            string
	// BlockedAt is when the chain was blocked, zero unless it is;
	// BlockedState how its head's job ended then (discarded, cancelled, or
	// deleted).
	BlockedAt    time.Time
	BlockedState string
}

// Blocked reports whether the chain waits for an operator.
func (c *ChainInfo) Blocked() bool { return !c.BlockedAt.IsZero() }

// ListChainsParams selects and pages the chains [Outbox.ListChains] lists.
type ListChainsParams struct {
	// Subscriber filters by subscriber name. Empty means every subscriber.
	Subscriber string
	// Blocked lists only blocked chains.
	Blocked bool
	// Limit is the page size. Defaults to ListLimitDefault (50); at most
	// 1000.
	Limit int
	// After is the Next cursor of the previous page; empty for the first.
	After string
}

// ListChainsResult is one page of chains.
type ListChainsResult struct {
	Chains []ChainInfo
	// Next is the cursor of the following page; empty on the last page.
	Next string
}

// ListChains lists the chains of ordered subscribers that have jobs not yet
// finished, by subscriber and subject, a page at a time: each one's head
// job with River's state of it, how many jobs wait, and whether it is
// blocked.
func (o Outbox) ListChains(ctx context.Context, db DB, params ListChainsParams) (ListChainsResult, error) {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return ListChainsResult{}, err
	}
	limit := params.Limit
	if limit == 0 {
		limit = ListLimitDefault
	}
	if limit < 1 || limit > 1000 {
		return ListChainsResult{}, invalidf(ErrInvalidArgument, "Limit", "%d: must be between 1 and 1000", params.Limit)
	}
	var subscriber, afterSub, afterSubject *string
	if params.Subscriber != "" {
		subscriber = &params.Subscriber
	}
	if params.After != "" {
		var cur [2]string
		if err := json.Unmarshal([]byte(params.After), &cur); err != nil {
			return ListChainsResult{}, invalidf(ErrInvalidArgument, "After", "%q: not a cursor from a previous page", params.After)
		}
		afterSub, afterSubject = &cur[0], &cur[1]
	}
	rows, err := db.Query(ctx, sql.Ordered.ListChains, limit+1, subscriber, params.Blocked, afterSub, afterSubject)
	if err != nil {
		return ListChainsResult{}, fmt.Errorf("events: list chains: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ChainInfo, error) {
		var (
			c            ChainInfo
			blockedAt    *time.Time
			blockedError string
			eventID      *uuid.UUID
			seq          *int64
			typ          *string
		)
		err := row.Scan(&c.Subscriber, &c.Subject, &c.HeadJobID, &blockedAt, &c.BlockedState, &blockedError,
			&eventID, &seq, &typ, &c.Jobs, &c.HeadState, &c.Attempt, &c.MaxAttempts, &c.LastError)
		c.BlockedAt = deref(blockedAt)
		c.LastError = cmp.Or(c.LastError, blockedError)
		if eventID != nil {
			c.HeadEventID, c.HeadEventSeq, c.HeadEventType = *eventID, *seq, *typ
		}
		return c, err
	})
	if err != nil {
		return ListChainsResult{}, fmt.Errorf("events: list chains: %w", err)
	}
	var res ListChainsResult
	if len(list) > limit {
		list = list[:limit]
		last := list[limit-1]
		cur, _ := json.Marshal([2]string{last.Subscriber, last.Subject})
		res.Next = string(cur)
	}
	res.Chains = list
	return res, nil
}

// ErrNotBlocked is returned by [Outbox.ResumeChain] and [Outbox.SkipChain]
// for a chain that is not blocked.
var ErrNotBlocked = errors.New("events: chain not blocked")

// ErrUnknownChain is returned by [Outbox.ResumeChain] and
// [Outbox.SkipChain] when the subscriber has no chain of that subject
// (nothing of it is waiting).
var ErrUnknownChain = errors.New("events: no such chain")

// ResumeChain resumes a blocked chain by retrying its head: the head's River
// job is made available again, as River's JobRetry makes it (with one more
// attempt if its attempts are spent), and the chain is unblocked; when that
// attempt succeeds the jobs behind it follow, in order. If it fails for good
// again, the chain blocks again. It returns an error wrapping
// [ErrUnknownChain] or [ErrNotBlocked], or, when River no longer has the
// head's job (its retention deleted it), one that says to skip it. With db a
// transaction, all of it happens in that transaction.
func (o Outbox) ResumeChain(ctx context.Context, db DB, subscriber, subject string) error {
	return o.chainAction(ctx, db, subscriber, subject, true)
}

// SkipChain gives a blocked chain's head up for good: it leaves the chain
// (its River job stays as River ended it), and the next job of the subject
// is released. It returns an error wrapping [ErrUnknownChain] or
// [ErrNotBlocked]. With db a transaction, all of it happens in that
// transaction.
func (o Outbox) SkipChain(ctx context.Context, db DB, subscriber, subject string) error {
	return o.chainAction(ctx, db, subscriber, subject, false)
}

func (o Outbox) chainAction(ctx context.Context, db DB, subscriber, subject string, resume bool) error {
	switch {
	case subscriber == "":
		return invalidf(ErrInvalidArgument, "subscriber", "is empty")
	case subject == "":
		return invalidf(ErrInvalidArgument, "subject", "is empty: events without a subject are not ordered")
	}
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return err
	}
	stmt, verb := sql.Ordered.ChainSkip, "skip"
	if resume {
		stmt, verb = sql.Ordered.ChainResume, "resume"
	}
	var outcome string
	if err := db.QueryRow(ctx, stmt, subscriber, subject, dbutil.NilIfEmpty(o.Schema)).Scan(&outcome); err != nil {
		return fmt.Errorf("events: %s chain %q of %q: %w", verb, subject, subscriber, err)
	}
	switch outcome {
	case "done":
		return nil
	case "unknown":
		return fmt.Errorf("%w: %q has no chain of subject %q", ErrUnknownChain, subscriber, subject)
	case "not_blocked":
		return fmt.Errorf("%w: %q of subject %q", ErrNotBlocked, subscriber, subject)
	case "gone":
		return fmt.Errorf("events: resume chain %q of %q: River no longer has its head's job; skip it instead", subject, subscriber)
	}
	return fmt.Errorf("events: %s chain %q of %q: unexpected outcome %q", verb, subject, subscriber, outcome)
}
