package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"go.opentelemetry.io/otel/trace"

	"github.com/standmeet/events/internal/claimfloor"
	"github.com/standmeet/events/internal/dbutil"
)

// claimedRow is an event a round holds locked.
type claimedRow struct {
	Event
	attempts int
	// owed lists, for a row of the deliveries lane, the deliveries of it the
	// round claimed; nil in the pending lane.
	owed []owedPair
	// paused names the subscribers an operator paused, as the claim read
	// them (pending lane).
	paused []string
	// traceContext is the recording request's W3C trace context (JSON), or
	// nil.
	traceContext []byte
	// slot is the partition the row is in: the stamp names the batch's.
	slot int16
}

// owedPair is a claimed delivery of the deliveries lane.
type owedPair struct {
	sub      string
	attempts int
	// due is when the pair fell due, and now the database clock at the
	// claim: they move the subscriber's claim floor (package owedfloor).
	due, now time.Time
}

// scanClaimed reads a row selected with claimColumns.
func scanClaimed(row pgx.Row) (claimedRow, error) {
	var c claimedRow
	err := row.Scan(&c.Seq, &c.ID, &c.Type, &c.Subject, &c.Scope, &c.Payload, &c.CreatedAt, &c.attempts, &c.traceContext, &c.slot, &c.paused)
	return c, err
}

// collectClaimed reads a claim's rows: one per event in the pending lane;
// one per delivery in the deliveries lane, grouped here by event (in the order
// of each event's first delivery).
func collectClaimed(rows pgx.Rows, l Lane) ([]claimedRow, error) {
	if l == LanePending {
		return pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimedRow, error) { return scanClaimed(row) })
	}
	defer rows.Close()
	var (
		batch []claimedRow
		index = map[int64]int{}
	)
	for rows.Next() {
		var (
			c claimedRow
			p owedPair
		)
		if err := rows.Scan(&c.Seq, &c.ID, &c.Type, &c.Subject, &c.Scope, &c.Payload, &c.CreatedAt, &p.attempts, &c.traceContext, &p.sub, &p.due, &p.now, &c.slot); err != nil {
			return nil, err
		}
		i, ok := index[c.Seq]
		if !ok {
			i = len(batch)
			index[c.Seq] = i
			batch = append(batch, c)
		}
		batch[i].owed = append(batch[i].owed, p)
	}
	// In seq order, as in the pending lane: coalescing keeps the latest
	// event, and ordered subscribers append in seq order.
	slices.SortFunc(batch, func(a, b claimedRow) int { return cmp.Compare(a.Seq, b.Seq) })
	return batch, rows.Err()
}

// collectClaimedFrom reads a ClaimFrom's rows, in (xid, seq) order, into a
// batch in seq order (as every pending batch is: coalescing keeps the latest
// event, and ordered subscribers append in seq order), and returns the
// last of them in (xid, seq) order.
func collectClaimedFrom(rows pgx.Rows) ([]claimedRow, claimfloor.Position, error) {
	var last claimfloor.Position
	batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimedRow, error) {
		var (
			c   claimedRow
			xid int64
		)
		err := row.Scan(&c.Seq, &c.ID, &c.Type, &c.Subject, &c.Scope, &c.Payload, &c.CreatedAt, &c.attempts, &c.traceContext, &c.slot, &c.paused, &xid)
		if xid > last.Xid || xid == last.Xid && c.Seq > last.Seq {
			last = claimfloor.Position{Xid: xid, Seq: c.Seq}
		}
		return c, err
	})
	slices.SortFunc(batch, func(a, b claimedRow) int { return cmp.Compare(a.Seq, b.Seq) })
	return batch, last, err
}

// Lane is where a round claims its rows: pending events, or the owed deliveries
// (event, subscriber) of the subscribers this relay knows.
type Lane int

const (
	LanePending Lane = iota
	LaneOwed
)

// roundError is a failed round. rowFault says whether the failure belongs to
// the claimed rows (bad data), as opposed to the database or the network.
type roundError struct {
	err      error
	rowFault bool
}

func (e *roundError) Error() string { return e.err.Error() }
func (e *roundError) Unwrap() error { return e.err }

// rowFailure is an event whose fan-out failed as a whole: no delivery of it
// could be blamed (its stamp failed).
type rowFailure struct {
	row claimedRow
	err error
}

// round claims rows of lane l with claimSQL and args, and fans them out, all
// in one transaction. It returns the seqs it claimed, also on failure, so the
// caller can retry them one by one.
func (r *Relay) round(ctx context.Context, l Lane, claimSQL string, args ...any) (claimed []int64, err error) {
	return r.roundIn(ctx, r.pool, l, false, claimSQL, args...)
}

// roundIn is round in a transaction begun on db: the pool, or the caller's
// transaction (a savepoint) for FanoutTx. With isolate, each job is inserted
// in a savepoint of its own, so a job that River or PostgreSQL refuses is
// charged to its delivery alone: the retry of a row whose batch failed.
func (r *Relay) roundIn(ctx context.Context, db Beginner, l Lane, isolate bool, claimSQL string, args ...any) (claimed []int64, err error) {
	var (
		poisonedAt func() []pairFailure
		span       trace.Span
	)
	start := time.Now()
	defer func() {
		if span != nil {
			if err != nil {
				span.RecordError(err)
			}
			span.End()
		}
		if len(claimed) > 0 {
			r.config.Metrics.RoundDuration.Record(ctx, seconds(time.Since(start)), r.laneAttr[l])
			r.config.Metrics.BatchSize.Record(ctx, int64(len(claimed)), r.laneAttr[l])
		}
	}()
	err = r.roundTx(ctx, db, l, claimSQL, args, func(tx pgx.Tx, batch []claimedRow) (*stamp, error) {
		for _, c := range batch {
			claimed = append(claimed, c.Seq)
		}
		if len(batch) == 0 {
			return nil, nil
		}
		// The round's span is the parent of what River's middleware does
		// with the insert (otelriver's insert span); it ends after the
		// commit.
		var spanCtx context.Context
		spanCtx, span = r.startRoundSpan(ctx, batch)
		// Only a batch round of the relay's own may insert by COPY: the
		// one-row rounds of a retry are what tells a COPY's failure from a
		// row's (copyFailed), so they keep River's INSERT.
		copyable := !isolate && db == Beginner(r.pool) && (claimSQL == r.sql.ClaimBatch || claimSQL == r.sql.ClaimOwed)
		st, err := r.fanout(spanCtx, tx, l, isolate, copyable, batch)
		if err != nil {
			return nil, &roundError{err: err, rowFault: isRowFault(ctx, tx, err)}
		}
		poisonedAt = st.poisonedAt
		return st, nil
	})
	if err != nil {
		return claimed, err
	}
	if len(claimed) > 0 {
		r.lastRound.Store(time.Now().UnixNano())
	}
	if poisonedAt != nil {
		for _, p := range poisonedAt() {
			r.alertPair(ctx, p)
		}
	}
	return claimed, nil
}

// stamp is what a round writes last, once its jobs are in: the stamps of
// its rows, the charges of its failed deliveries and the notifications for the
// receipts. A round of the relay's own sends it with its COMMIT, in one
// round trip.
type stamp struct {
	pgx.Batch
	events int
	// poisonedAt lists the deliveries the charges poisoned, once sent.
	poisonedAt func() []pairFailure
}

// roundTx claims rows of lane l with claimSQL and args, runs work on them in
// the same transaction, and sends the stamp work returns (nil: nothing to
// stamp), then commits. The transaction is the round's own on the pool, or a
// savepoint of the caller's transaction (FanoutTx), whose commit is the
// caller's to decide.
//
// A round of its own takes two round trips beside its job insert: the BEGIN,
// the setting below and the claim are sent together, and so are the stamp
// and the COMMIT. A stamp that fails leaves the transaction aborted before
// its COMMIT runs, and it is rolled back; a failed stamp comes back as a
// *roundError, with rowFault set when the rows' data was refused.
//
// Its job inserts merge the pending lists of River's GIN indexes once they
// pass 128 kB rather than 4 MB (RoundSettings says why: a 4 MB merge
// stalled rounds for 80–180 ms).
//
// It commits with synchronous_commit off. The round is atomic and
// idempotent on loss: if the server crashes before its commit reaches disk
// (at most about three wal_writer_delay, 600 ms by default), the jobs, the
// stamps and the notifications vanish together and the rows are claimed
// again, so nothing is lost and the database never holds two fan-outs of
// one event. Every transaction that depends on the round commits
// synchronously after it — River's fetch of a job, a worker's completion —
// and its flush (and its wait for a synchronous standby) covers the round's
// commit record, so a job any worker saw is never lost. What the round saves
// is its own WAL flush on the fan-out path: about a quarter of
// commit-to-fanned at low rates.
func (r *Relay) roundTx(ctx context.Context, db Beginner, l Lane, claimSQL string, args []any,
	work func(tx pgx.Tx, batch []claimedRow) (*stamp, error),
) (err error) {
	own := db == Beginner(r.pool)
	tx, batch, claimed, release, err := r.beginClaim(ctx, db, own, l, claimSQL, args)
	if err != nil {
		return err
	}
	defer release()
	committed := false
	defer func() {
		if !committed && tx.Conn().PgConn().TxStatus() != 'I' {
			_ = tx.Rollback(ctx) // a failed rollback closes the connection
		}
		if claimed != nil {
			claimed(committed && err == nil)
		}
	}()
	st, err := work(tx, batch)
	if err != nil {
		return err
	}
	if st == nil || st.Len() == 0 {
		committed = true
		return tx.Commit(ctx)
	}
	if own {
		st.Queue(r.sql.Commit).Exec(func(tag pgconn.CommandTag) error {
			if tag.String() == "ROLLBACK" {
				return pgx.ErrTxCommitRollback
			}
			return nil
		})
	}
	if err := tx.SendBatch(ctx, &st.Batch).Close(); err != nil {
		return &roundError{err: fmt.Errorf("stamping %d events: %w", st.events, err), rowFault: isRowFault(ctx, nil, err)}
	}
	committed = true
	if own {
		return nil // the COMMIT was the batch's last statement
	}
	return tx.Commit(ctx)
}

// beginClaim begins a round's transaction and claims its rows: for a round
// of its own (own: db is the relay's pool), the BEGIN, RoundSettings and the
// claim in one batch (one round trip); inside the caller's transaction, a
// savepoint, then the claim. release gives a pool connection back (one left
// inside a transaction is closed).
//
// A pending-lane batch claim of its own (claimSQL is ClaimBatch) starts
// where the relay's claim floor says (ClaimFrom, or ClaimBatch for a full
// rescan), and ended, called once the round has committed or failed, moves
// the floor, or lowers it to where the claim started (the rows it held are
// pending again). A deliveries-lane claim (ClaimOwed) starts at its
// subscribers' floors (owedRound), and ended raises them once the round has
// committed. ended is nil for other claims.
func (r *Relay) beginClaim(ctx context.Context, db Beginner, own bool, l Lane, claimSQL string, args []any,
) (tx pgx.Tx, batch []claimedRow, ended func(committed bool), release func(), err error) {
	if !own {
		tx, err := db.Begin(ctx)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		rows, err := tx.Query(ctx, claimSQL, args...)
		var batch []claimedRow
		if err == nil {
			batch, err = collectClaimed(rows, l)
		}
		if err != nil {
			_ = tx.Rollback(ctx)
			return nil, nil, nil, nil, err
		}
		return tx, batch, nil, func() {}, nil
	}
	var (
		floored = l == LanePending && claimSQL == r.sql.ClaimBatch
		fc      claimfloor.Claim
		snap    claimfloor.Snapshot
		last    claimfloor.Position
	)
	if floored {
		fc = r.claimFloor.Next()
		if r.Hooks.FloorClaim != nil {
			r.Hooks.FloorClaim(fc)
		}
		if fc.Kind == claimfloor.From {
			claimSQL, args = r.sql.ClaimFrom, []any{args[0], fc.From, fc.FromSeq, fc.Running}
		}
	}
	c, err := r.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	var b pgx.Batch
	b.BeginTx(OwnTx)
	b.Queue(r.sql.RoundSettings).QueryRow(func(row pgx.Row) error {
		var text string
		if err := row.Scan(nil, nil, &text); err != nil {
			return err
		}
		var perr error
		snap, perr = claimfloor.ParseSnapshot(text)
		return perr
	})
	b.Queue(claimSQL, args...).Query(func(rows pgx.Rows) (err error) {
		if claimSQL == r.sql.ClaimFrom {
			batch, last, err = collectClaimedFrom(rows)
			return err
		}
		batch, err = collectClaimed(rows, l)
		return err
	})
	tx, err = dbutil.SendBegun(ctx, c, &b)
	if err != nil {
		c.Release()
		return nil, nil, nil, nil, err
	}
	if l == LaneOwed && claimSQL == r.sql.ClaimOwed {
		names, dues, seqs := args[0].([]string), args[4].([]time.Time), args[5].([]int64)
		ended = func(committed bool) {
			if committed {
				r.observeOwed(batch, names, dues, seqs)
			}
		}
	}
	if floored {
		size := int(args[0].(int64))
		n := len(batch)
		ended = func(committed bool) {
			if committed {
				r.claimFloor.Observe(fc, snap, n, size, last, time.Now())
			} else {
				r.claimFloor.Failed(fc) // the rows it held are pending again
			}
		}
	}
	return tx, batch, ended, c.Release, nil
}

// fanout inserts the jobs of a claimed batch inside tx and returns the stamp
// to send after them. A delivery whose subscriber's mapping fails (or, with
// isolate, whose job is refused) is charged a failed attempt in the stamp
// and stays owed; every other delivery goes ahead, and in the pending lane every
// event is stamped fanned out.
func (r *Relay) fanout(ctx context.Context, tx pgx.Tx, l Lane, isolate, copyable bool, batch []claimedRow) (*stamp, error) {
	p, err := r.plan(ctx, l, batch)
	if err != nil {
		return nil, err
	}
	// Ordered subscribers' jobs take their places in their chains (a no-op
	// without any); a job that must wait for an earlier event is taken out
	// and its deliveries deferred (chains.go).
	chains, err := r.orderChains(ctx, tx, l, batch, &p)
	if err != nil {
		return nil, err
	}
	results, err := r.insertJobs(ctx, tx, &p, isolate, copyable, batch, chains.replaced(p.jobs))
	if err != nil {
		return nil, err
	}
	if r.Hooks.AfterInsert != nil {
		r.Hooks.AfterInsert(ctx, tx)
	}
	fanout := fanoutByEvent(p.jobs, results, len(batch))
	st := &stamp{events: len(batch)}
	fanned := 0
	if l == LaneOwed {
		r.queueStampOwed(&st.Batch, batch, fanout, p.failed, chains)
	} else {
		r.queueStampPending(&st.Batch, batch, fanout)
		fanned = len(batch)
	}
	if err := chains.queue(&st.Batch, batch, p.jobs, results); err != nil {
		return nil, err
	}
	st.poisonedAt = r.queueDeliveryCharges(&st.Batch, p.failed)
	r.countFanout(ctx, fanned, p.jobs, results)
	return st, nil
}

// insertJobs inserts p's jobs in tx, all in one call, and returns their
// results in the order of p.jobs: results, where it holds one already (an
// ordered subscriber's job that replaces a waiting one is not inserted), and
// the inserted job's otherwise. With isolate each job is inserted in a
// savepoint of its own: one refused on its own account has a nil result and
// its deliveries are added to p.failed.
func (r *Relay) insertJobs(ctx context.Context, tx pgx.Tx, p *roundPlan, isolate, copyable bool, batch []claimedRow,
	results []*rivertype.JobInsertResult,
) ([]*rivertype.JobInsertResult, error) {
	if isolate {
		for i, j := range p.jobs {
			if results[i] != nil {
				continue
			}
			res, err := r.insertIsolated(ctx, tx, j, batch[j.event].traceContext)
			if err == nil {
				results[i] = res
				continue
			}
			var re *roundError
			if !errors.As(err, &re) || !re.rowFault {
				return nil, err
			}
			for _, ev := range j.covers {
				p.failed = append(p.failed, pairFailure{row: batch[ev], sub: j.sub, attempts: attemptsOf(batch[ev], j.sub.Name), err: re.err})
			}
		}
		return results, nil
	}
	params := make([]river.InsertManyParams, 0, len(p.jobs))
	at := make([]int, 0, len(p.jobs))
	for i, j := range p.jobs {
		if results[i] == nil {
			params = append(params, river.InsertManyParams{Args: j.args, InsertOpts: j.insertOpts(batch[j.event].traceContext)})
			at = append(at, i)
			copyable = copyable && !j.unique
		}
	}
	if len(params) == 0 {
		return results, nil
	}
	var (
		inserted []*rivertype.JobInsertResult
		err      error
	)
	if copyable && len(params) >= copyMinJobs && !r.noCopy.Load() {
		kind := func(k int) string { return p.jobs[at[k]].kind }
		if inserted, err = r.insertCopied(ctx, tx, params, kind); err != nil {
			err = &copyFailure{err}
		}
	} else {
		inserted, err = r.insertMany(ctx, tx, params)
	}
	if err != nil {
		return nil, fmt.Errorf("inserting %d jobs: %w", len(params), err)
	}
	if len(inserted) != len(params) {
		return nil, fmt.Errorf("inserting %d jobs: River returned %d results", len(params), len(inserted))
	}
	for k, i := range at {
		results[i] = inserted[k]
	}
	return results, nil
}

// fanoutByEvent lists, for each of n events, the jobs that name it:
// subscriber name -> job ID, in subscriber order. A job that was refused
// (no result) names nothing.
func fanoutByEvent(jobs []plannedJob, results []*rivertype.JobInsertResult, n int) [][]fanoutEntry {
	fanout := make([][]fanoutEntry, n)
	for i, j := range jobs {
		if results[i] == nil {
			continue
		}
		for _, ev := range j.covers {
			fanout[ev] = append(fanout[ev], fanoutEntry{j.sub.Name, results[i].Job.ID})
		}
	}
	return fanout
}

// queueStampPending queues, in b, the stamp of a pending-lane batch: every
// event fanned out with its fanout, and owed to the registered subscribers
// the round did not serve; then the notifications that answer the events'
// receipts, delivered at commit and only if it commits. Receipts are
// answered at the first fan-out (AwaitDelivery waits for the lane).
func (r *Relay) queueStampPending(b *pgx.Batch, batch []claimedRow, fanout [][]fanoutEntry) {
	seqs, docs, ids, slots := make([]int64, len(batch)), make([]string, len(batch)), make([]uuid.UUID, len(batch)), make([]int16, len(batch))
	for i, c := range batch {
		seqs[i], docs[i], ids[i], slots[i] = c.Seq, encodeFanout(fanout[i]), c.ID, c.slot
	}
	b.Queue(r.sql.Stamp, seqs, docs, r.served(batch[0].paused), slots)
	r.queueNotifyFanned(b, ids)
}

// queueStampOwed queues, in b, the stamp of a deliveries-lane batch: the
// events' fanout extended with their new jobs, and every claimed delivery that
// did not fail and was not deferred (an ordered subscriber's, behind an
// earlier event) served (its job inserted, or its Map skipped it, or it no
// longer matches); then the notifications that wake AwaitDelivery's
// waiters, at commit.
func (r *Relay) queueStampOwed(b *pgx.Batch, batch []claimedRow, fanout [][]fanoutEntry, failed []pairFailure, chains *chainPlan) {
	isFailed := make(map[[2]any]bool, len(failed))
	for _, f := range failed {
		isFailed[[2]any{f.row.Seq, f.sub.Name}] = true
	}
	var (
		seqs     = make([]int64, 0, len(batch))
		docs     = make([]string, 0, len(batch))
		slots    = make([]int16, 0, len(batch))
		doneSeqs []int64
		doneSubs []string
		served   []uuid.UUID
	)
	for i, c := range batch {
		if len(fanout[i]) > 0 {
			seqs = append(seqs, c.Seq)
			docs = append(docs, encodeFanout(fanout[i]))
			slots = append(slots, c.slot)
		}
		for _, o := range c.owed {
			if !isFailed[[2]any{c.Seq, o.sub}] && !chains.isDeferred(c.Seq, o.sub) {
				doneSeqs = append(doneSeqs, c.Seq)
				doneSubs = append(doneSubs, o.sub)
			}
		}
		if len(fanout[i]) > 0 || len(c.owed) > 0 {
			served = append(served, c.ID)
		}
	}
	if len(seqs) == 0 && len(doneSeqs) == 0 {
		return
	}
	b.Queue(r.sql.StampOwed, seqs, docs, doneSeqs, doneSubs, slots)
	r.queueNotifyFanned(b, served)
}

// queueNotifyFanned queues the fanned channel's notifications for ids.
func (r *Relay) queueNotifyFanned(b *pgx.Batch, ids []uuid.UUID) {
	for _, payload := range notifyPayloads(ids) {
		b.Queue(r.sql.NotifyFanned, payload)
	}
}

// countFanout records a round's metrics: the events it fanned out, its jobs,
// and the events folded into coalesced jobs. Counted before the commit: a
// round that then fails to commit counts its events twice, which a metric
// may; nothing else does.
func (r *Relay) countFanout(ctx context.Context, fanned int, jobs []plannedJob, results []*rivertype.JobInsertResult) {
	if fanned > 0 {
		r.config.Metrics.Fanned.Add(ctx, int64(fanned))
	}
	for i, j := range jobs {
		if results[i] == nil {
			continue
		}
		if j.chain.replacing() {
			// No job inserted: the waiting one took this job's events.
			r.config.Metrics.Coalesced.Add(ctx, int64(len(j.covers)), j.sub.metricAttrs)
			continue
		}
		r.config.Metrics.Jobs.Add(ctx, 1, j.sub.metricAttrs)
		if n := len(j.covers) - 1; n > 0 {
			r.config.Metrics.Coalesced.Add(ctx, int64(n), j.sub.metricAttrs)
		}
	}
}

// insertMany is River's InsertManyTx, with a panic turned into an error
// (riverInsert).
func (r *Relay) insertMany(ctx context.Context, tx pgx.Tx, params []river.InsertManyParams) ([]*rivertype.JobInsertResult, error) {
	return riverInsert(func() ([]*rivertype.JobInsertResult, error) { return r.client.InsertManyTx(ctx, tx, params) })
}

// riverInsert runs one of River's inserts, with a panic turned into an
// error. River calls host code there: the job args' own methods (Kind,
// InsertOpts, MarshalJSON) and the client's insert hooks and middleware. A
// panic in it must fail its job, not crash the host's process. The error is
// handled as any refusal is: a batch is rolled back and retried job by job,
// and a job inserted alone rolls back its savepoint and is charged to its
// deliveries.
func riverInsert[T any](insert func() (T, error)) (res T, err error) {
	defer func() {
		if p := recover(); p != nil {
			var zero T
			res, err = zero, PanicError("River's insert (the job args' methods, insert hooks or middleware)", p)
		}
	}()
	return insert()
}

// copyMinJobs is the fewest jobs a round inserts by COPY. A COPY takes two
// round trips and the IDs' lookup a third, where River's INSERT takes one: a
// small round, the common one at low rates, is quicker with the INSERT.
const copyMinJobs = 32

// insertCopied is insertMany through River's COPY insert, InsertManyFastTx:
// the same hooks, middleware and insert notifications, without the INSERT's
// unnest and ON CONFLICT, and without River sending every row back. It
// takes no unique job (a COPY fails on a conflict rather than skip it), so
// the caller sends none, and only a round's own transaction: the IDs' lookup
// knows the jobs by their xmin, which a savepoint's rows do not share.
//
// The jobs' IDs are found after it (NewestJobs): a COPY draws them from
// river_job's sequence one row after the other, so the transaction's newest
// len(params) jobs are params' jobs, in order. Their kinds are checked
// against kind(k), params[k]'s: a mismatch (an insert middleware that changes a kind, or
// inserts jobs of its own) fails the round and turns COPY off for the run
// at once. Any other failure is the rows' or COPY's: copyFailed tells.
func (r *Relay) insertCopied(ctx context.Context, tx pgx.Tx, params []river.InsertManyParams, kind func(k int) string) ([]*rivertype.JobInsertResult, error) {
	n, err := riverInsert(func() (int, error) { return r.client.InsertManyFastTx(ctx, tx, params) })
	if err != nil {
		return nil, err
	}
	if n != len(params) {
		return nil, r.copyUnsuited(ctx, fmt.Errorf("the COPY inserted %d jobs of %d", n, len(params)))
	}
	res := make([]*rivertype.JobInsertResult, n)
	left, below := n, int64(math.MaxInt64) // res[:left] is still to find
	for left > 0 {
		var (
			id       int64
			got      string
			ours     bool
			seen     int
			mismatch error
		)
		rows, err := tx.Query(ctx, r.sql.NewestJobs, left+left/4+16, below)
		if err != nil {
			return nil, err
		}
		_, err = pgx.ForEachRow(rows, []any{&id, &got, &ours}, func() error {
			seen++
			below = id
			if !ours || left == 0 || mismatch != nil {
				return nil
			}
			left--
			if want := kind(left); got != want {
				mismatch = fmt.Errorf("job %d is of kind %q where the round inserted %q", id, got, want)
				return nil
			}
			res[left] = &rivertype.JobInsertResult{Job: &rivertype.JobRow{ID: id, Kind: got}}
			return nil
		})
		switch {
		case err != nil:
			return nil, fmt.Errorf("finding the IDs of %d jobs inserted by COPY: %w", n, err)
		case mismatch != nil:
			return nil, r.copyUnsuited(ctx, mismatch)
		case seen == 0:
			return nil, r.copyUnsuited(ctx, fmt.Errorf("%d of the %d jobs inserted by COPY not found", left, n))
		}
	}
	return res, nil
}

// copyFailure is a round's failure in its COPY insert (insertCopied).
type copyFailure struct{ err error }

func (e *copyFailure) Error() string { return e.err.Error() }
func (e *copyFailure) Unwrap() error { return e.err }

// copyUnsuited turns COPY off for the run, as the jobs a COPY inserted were
// not the round's (err says how), and returns err.
func (r *Relay) copyUnsuited(ctx context.Context, err error) error {
	r.copyOff(ctx, "the jobs inserted by COPY could not be told apart", err)
	return err
}

// copyOff turns COPY off for the run, warning once why.
func (r *Relay) copyOff(ctx context.Context, why string, err error) {
	if !r.noCopy.Swap(true) {
		r.config.Logger.WarnContext(ctx, "events: "+why+"; the relay inserts with River's InsertManyTx from now on", slog.String("err", err.Error()))
	}
}

// copyFailed is called once the rows of a round that failed (err) were
// retried row by row, to the end: one-row rounds, inserted with River's
// INSERT. When the round failed in its COPY on the rows' account (not the
// database's: a deadlock, a timeout) and every row then went in (none
// failed, none was taken meanwhile by another relay), the failure was
// COPY's alone (an insert middleware that refuses the results a COPY does
// not return, a unique index of the host's own), and COPY is turned off for
// the run; when a row failed on its own, or may have, COPY stays on.
func (r *Relay) copyFailed(ctx context.Context, err error, rowFaults int) {
	var (
		cf *copyFailure
		re *roundError
	)
	if rowFaults == 0 && errors.As(err, &cf) && errors.As(err, &re) && re.rowFault {
		r.copyOff(ctx, "inserting jobs by COPY failed where River's InsertManyTx did not", cf.err)
	}
}

// insertIsolated inserts one job in a savepoint of tx. A refusal that is
// the job's own fault comes back as a *roundError with rowFault set, and tx
// is usable again.
func (r *Relay) insertIsolated(ctx context.Context, tx pgx.Tx, j plannedJob, traceContext []byte) (*rivertype.JobInsertResult, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	res, err := r.insertMany(ctx, sp, []river.InsertManyParams{{Args: j.args, InsertOpts: j.insertOpts(traceContext)}})
	if err == nil && len(res) != 1 {
		err = fmt.Errorf("inserting 1 job: River returned %d results", len(res))
	}
	if err != nil {
		_ = sp.Rollback(ctx)
		return nil, &roundError{err: err, rowFault: isRowFault(ctx, tx, err)}
	}
	if err := sp.Commit(ctx); err != nil {
		return nil, err
	}
	return res[0], nil
}

// attemptsOf is how many failed attempts the delivery (c, sub) has behind it.
func attemptsOf(c claimedRow, sub string) int {
	for _, o := range c.owed {
		if o.sub == sub {
			return o.attempts
		}
	}
	return 0
}

// served returns the names of the subscribers a pending round serves: the
// run's active ones less the paused. Every other registered subscriber is
// owed the matching events (see the Stamp statement).
func (r *Relay) served(paused []string) []string {
	if len(paused) == 0 {
		return r.known
	}
	out := make([]string, 0, len(r.known))
	for _, n := range r.known {
		if !slices.Contains(paused, n) {
			out = append(out, n)
		}
	}
	return out
}

type fanoutEntry struct {
	subscriber string
	jobID      int64
}

// encodeFanout writes {"name":jobID,…}. Subscriber names are restricted to
// characters that need no JSON escaping.
func encodeFanout(entries []fanoutEntry) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, e := range entries {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		b.WriteString(e.subscriber)
		b.WriteString(`":`)
		b.WriteString(strconv.FormatInt(e.jobID, 10))
	}
	b.WriteByte('}')
	return b.String()
}

// maxNotifyIDs keeps a notification payload (IDs joined by commas) under
// PostgreSQL's 8000-byte limit: 200 × 37 - 1 = 7399 bytes.
const maxNotifyIDs = 200

// notifyPayloads splits ids into comma-separated notification payloads.
func notifyPayloads(ids []uuid.UUID) []string {
	var out []string
	for len(ids) > 0 {
		n := min(len(ids), maxNotifyIDs)
		var b strings.Builder
		b.Grow(n * 37)
		for i, id := range ids[:n] {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(id.String())
		}
		out = append(out, b.String())
		ids = ids[n:]
	}
	return out
}

// rowByRow retries the given rows one per transaction, after their batch
// failed with failure. A row that fails on its own is retried with each job
// in a savepoint, so the refused delivery is charged alone; a failure of the
// database stops the pass (the rows stay pending, and nothing is charged,
// and it is logged), and so does the relay's stop. A pass that ends tells
// copyFailed what it proved.
func (r *Relay) rowByRow(ctx context.Context, l Lane, seqs []int64, failure error) {
	faults, err := r.retryRows(ctx, l, seqs)
	switch {
	case err == nil:
		r.copyFailed(ctx, failure, faults)
	case ctx.Err() == nil && !errors.Is(err, errStopping):
		what := "events: row-by-row retry interrupted"
		if l == LaneOwed {
			what = "events: row-by-row retry of owed deliveries interrupted"
		}
		r.config.Logger.WarnContext(ctx, what, slog.String("err", err.Error()))
	}
}

// retryRows is rowByRow's pass: it stops at a failure of the database, or
// at the relay's stop (errStopping). rowFaults counts the rows that failed
// on their own, and those it found taken (by another relay, or charged
// meanwhile): they may have.
func (r *Relay) retryRows(ctx context.Context, l Lane, seqs []int64) (rowFaults int, err error) {
	for _, seq := range seqs {
		if ctx.Err() != nil {
			return rowFaults, ctx.Err()
		}
		if r.stopping() {
			return rowFaults, errStopping
		}
		var (
			claimed int64
			faulted bool
		)
		if l == LaneOwed {
			claimed, faulted, err = r.singleClaimed(ctx, l, r.sql.ClaimOwedOne, r.known, seq)
		} else {
			claimed, faulted, err = r.singleClaimed(ctx, l, r.sql.ClaimOne, seq)
		}
		if faulted || (claimed == 0 && err == nil) {
			rowFaults++
		}
		if err != nil {
			return rowFaults, err
		}
	}
	return rowFaults, nil
}

// retryDue fans out, one per transaction, the failed events whose retry time
// has come.
func (r *Relay) retryDue(ctx context.Context) error {
	for !r.stopping() && ctx.Err() == nil {
		seq, _, err := r.singleClaimed(ctx, LanePending, r.sql.ClaimDue, 1)
		if err != nil {
			return err
		}
		if seq == 0 {
			return nil
		}
	}
	return nil
}

// singleClaimed runs a one-row round; if the row fails on its own (faulted),
// it runs it again with every job isolated (each delivery that River or
// PostgreSQL refuses is charged alone), and if even that fails on the row's
// own account (its stamp), charges the event as a whole. It returns the
// claimed seq (0 for none) and any error that is not the row's fault.
func (r *Relay) singleClaimed(ctx context.Context, l Lane, claimSQL string, args ...any) (seq int64, faulted bool, err error) {
	claimed, err := r.round(ctx, l, claimSQL, args...)
	if len(claimed) == 0 {
		return 0, false, err
	}
	var re *roundError
	if err == nil || !errors.As(err, &re) || !re.rowFault {
		return claimed[0], false, err
	}
	again, err := r.roundIn(ctx, r.pool, l, true, claimSQL, args...)
	if len(again) == 0 || err == nil || !errors.As(err, &re) || !re.rowFault {
		return claimed[0], true, err
	}
	if l == LaneOwed {
		return claimed[0], true, err // the stamp of owed pairs failed: the database's business
	}
	// The row's own transaction is gone; record the failure in a new one.
	row, err2 := r.loadRow(ctx, claimed[0])
	if err2 != nil {
		return claimed[0], true, err2
	}
	var b pgx.Batch
	poisoned := r.queueCharges(&b, []rowFailure{{row: row, err: re.err}})
	if err2 := r.pool.SendBatch(ctx, &b).Close(); err2 != nil {
		return claimed[0], true, err2
	}
	for _, p := range poisoned() {
		r.alert(ctx, p.row.Event, p.err)
	}
	return claimed[0], true, nil
}

func (r *Relay) loadRow(ctx context.Context, seq int64) (claimedRow, error) {
	return scanClaimed(r.pool.QueryRow(ctx, r.sql.Load, seq))
}
