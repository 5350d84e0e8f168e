package events

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/standmeet/events/internal/hostcall"
)

// claimedRow is an event a round holds locked.
type claimedRow struct {
	Event
	attempts int
	// catchUp lists, for a row of the catch-up lane, the subscribers that
	// still have to receive it; nil in the pending lane.
	catchUp []string
	// traceContext is the recording request's W3C trace context (JSON), or
	// nil.
	traceContext []byte
}

// scanClaimed reads a row selected with claimColumns.
func scanClaimed(row pgx.Row) (claimedRow, error) {
	var c claimedRow
	err := row.Scan(&c.Seq, &c.ID, &c.Type, &c.Subject, &c.Scope, &c.Payload, &c.CreatedAt, &c.attempts, &c.catchUp, &c.traceContext)
	return c, err
}

// lane is where a round claims its rows: pending events, or fanned-out
// events that subscribers this relay knows must still catch up.
type lane int

const (
	lanePending lane = iota
	laneCatchUp
)

// roundError is a failed round. rowFault says whether the failure belongs to
// the claimed rows (bad data), as opposed to the database or the network.
type roundError struct {
	err      error
	rowFault bool
}

func (e *roundError) Error() string { return e.err.Error() }
func (e *roundError) Unwrap() error { return e.err }

// rowFailure is an event whose fan-out failed on its own.
type rowFailure struct {
	row claimedRow
	err error
}

// round claims rows of lane l with claimSQL and args, and fans them out, all
// in one transaction. It returns the seqs it claimed, also on failure, so the
// caller can retry them one by one.
func (r *Relay) round(ctx context.Context, l lane, claimSQL string, args ...any) (claimed []int64, err error) {
	return r.roundIn(ctx, r.pool, l, claimSQL, args...)
}

// roundIn is round in a transaction begun on db: the pool, or the caller's
// transaction (a savepoint) for FanOutTx.
func (r *Relay) roundIn(ctx context.Context, db Beginner, l lane, claimSQL string, args ...any) (claimed []int64, err error) {
	var poisoned []rowFailure
	start := time.Now()
	defer func() {
		if len(claimed) > 0 {
			r.metrics.roundDuration.Record(ctx, seconds(time.Since(start)), r.laneAttr[l])
			r.metrics.batchSize.Record(ctx, int64(len(claimed)), r.laneAttr[l])
		}
	}()
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, claimSQL, args...)
		if err != nil {
			return err
		}
		batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimedRow, error) { return scanClaimed(row) })
		if err != nil {
			return err
		}
		for _, c := range batch {
			claimed = append(claimed, c.Seq)
		}
		if len(batch) == 0 {
			return nil
		}
		spanCtx, span := r.startRoundSpan(ctx, batch)
		defer span.End()
		// The round's span is the parent of what River's middleware does
		// with the insert (otelriver's insert span).
		poisoned, err = r.fanOut(spanCtx, tx, l, batch)
		if err != nil {
			span.RecordError(err)
		}
		if err != nil {
			return &roundError{err: err, rowFault: isRowFault(ctx, tx, err)}
		}
		return nil
	})
	if err != nil {
		return claimed, err
	}
	for _, p := range poisoned {
		r.alert(ctx, p.row.Event, p.err)
	}
	return claimed, nil
}

// fanOut inserts the jobs of a claimed batch and stamps it, inside tx. Events
// whose subscriber mapping fails are charged a failed attempt in the same
// transaction and left unstamped; the others go ahead. It returns the events
// this call poisoned.
func (r *Relay) fanOut(ctx context.Context, tx pgx.Tx, l lane, batch []claimedRow) ([]rowFailure, error) {
	p, err := r.plan(ctx, l, batch)
	if err != nil {
		return nil, err
	}
	var results []*rivertype.JobInsertResult
	if len(p.jobs) > 0 {
		params := make([]river.InsertManyParams, len(p.jobs))
		for i, j := range p.jobs {
			params[i] = river.InsertManyParams{Args: j.args, InsertOpts: j.insertOpts(batch[j.event].traceContext)}
		}
		if results, err = r.client.InsertManyTx(ctx, tx, params); err != nil {
			return nil, fmt.Errorf("inserting %d jobs: %w", len(params), err)
		}
		if len(results) != len(params) {
			return nil, fmt.Errorf("inserting %d jobs: River returned %d results", len(params), len(results))
		}
	}
	if r.hooks.afterInsert != nil {
		r.hooks.afterInsert(ctx, tx)
	}

	// fanout per event: subscriber name -> job ID, in subscriber order.
	fanout := make([][]fanoutEntry, len(batch))
	for i, j := range p.jobs {
		for _, ev := range j.covers {
			fanout[ev] = append(fanout[ev], fanoutEntry{j.sub.Name, results[i].Job.ID})
		}
	}
	var (
		seqs     = make([]int64, 0, len(batch))
		docs     = make([]string, 0, len(batch))
		ids      = make([]uuid.UUID, 0, len(batch))
		failures []rowFailure
		sendBuf  pgx.Batch
	)
	for i, c := range batch {
		if p.failed[i] != nil {
			failures = append(failures, rowFailure{row: c, err: p.failed[i]})
			continue
		}
		seqs = append(seqs, c.Seq)
		docs = append(docs, encodeFanout(fanout[i]))
		ids = append(ids, c.ID)
	}
	switch {
	case len(seqs) == 0:
	case l == laneCatchUp:
		sendBuf.Queue(r.sql.StampCatchUp, seqs, docs, r.known)
	default:
		sendBuf.Queue(r.sql.Stamp, seqs, docs, r.known)
		// Delivered at commit, and only if it commits. Receipts were
		// answered at the first fan-out; a catch-up sends none.
		for _, payload := range notifyPayloads(ids) {
			sendBuf.Queue(r.sql.NotifyFanned, payload)
		}
	}
	poisonedAt := r.queueCharges(&sendBuf, failures)
	if err := tx.SendBatch(ctx, &sendBuf).Close(); err != nil {
		return nil, fmt.Errorf("stamping %d events: %w", len(seqs), err)
	}
	// Counted before the commit: a round that then fails to commit counts
	// its events twice, which a metric may; nothing else does.
	if l == lanePending {
		r.metrics.fanned.Add(ctx, int64(len(seqs)))
	}
	for _, j := range p.jobs {
		r.metrics.jobs.Add(ctx, 1, j.sub.metricAttrs)
		if n := len(j.covers) - 1; n > 0 {
			r.metrics.coalesced.Add(ctx, int64(n), j.sub.metricAttrs)
		}
	}
	return poisonedAt(), nil
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

// rowByRow retries the given rows one per transaction, after a failed batch.
// A row that fails on its own is charged a failed attempt; a failure of the
// database stops the pass (the rows stay pending, and nothing is charged).
func (r *Relay) rowByRow(ctx context.Context, l lane, seqs []int64) error {
	for _, seq := range seqs {
		if r.stopping() || ctx.Err() != nil {
			return ctx.Err()
		}
		var err error
		if l == laneCatchUp {
			_, err = r.singleClaimed(ctx, l, r.sql.ClaimCatchUpOne, r.known, seq)
		} else {
			_, err = r.singleClaimed(ctx, l, r.sql.ClaimOne, seq)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// retryDue fans out, one per transaction, the failed events whose retry time
// has come.
func (r *Relay) retryDue(ctx context.Context) error {
	for !r.stopping() && ctx.Err() == nil {
		seq, err := r.singleClaimed(ctx, lanePending, r.sql.ClaimDue, 1)
		if err != nil {
			return err
		}
		if seq == 0 {
			return nil
		}
	}
	return nil
}

// singleClaimed runs a one-row round and charges the row if it failed on its
// own. It returns the claimed seq (0 for none) and any error that is not the
// row's fault.
func (r *Relay) singleClaimed(ctx context.Context, l lane, claimSQL string, args ...any) (int64, error) {
	claimed, err := r.round(ctx, l, claimSQL, args...)
	if len(claimed) == 0 {
		return 0, err
	}
	var re *roundError
	if err == nil || !errors.As(err, &re) || !re.rowFault {
		return claimed[0], err
	}
	// The row's own transaction is gone; record the failure in a new one.
	row, err2 := r.loadRow(ctx, claimed[0])
	if err2 != nil {
		return claimed[0], err2
	}
	var b pgx.Batch
	poisoned := r.queueCharges(&b, []rowFailure{{row: row, err: re.err}})
	if err2 := r.pool.SendBatch(ctx, &b).Close(); err2 != nil {
		return claimed[0], err2
	}
	for _, p := range poisoned() {
		r.alert(ctx, p.row.Event, p.err)
	}
	return claimed[0], nil
}

func (r *Relay) loadRow(ctx context.Context, seq int64) (claimedRow, error) {
	return scanClaimed(r.pool.QueryRow(ctx, r.sql.Load, seq))
}

// FanOutTx fans out, inside tx, every event pending now — committed ones, and
// those recorded in tx itself — as the relay's rounds would: jobs inserted
// through client, rows stamped, all in tx, so nothing is visible until tx
// commits and a rollback undoes it. It registers the relay's subscribers in
// tx first. It returns how many events it claimed.
//
// It starts no goroutine and needs no LISTEN: it is for tests (see package
// eventstest) and for hosts that drive fan-out themselves. An event whose
// mapping fails is charged an attempt like in a round; a failure of a whole
// batch returns the error, and the caller's transaction is still usable
// (each round runs in a savepoint). The relay must not be started: it
// returns an error wrapping [ErrStarted] otherwise, and [Relay.Start]
// returns one while a FanOutTx call runs. [Relay.Stop] leaves a call in
// progress alone: ctx bounds it.
func (r *Relay) FanOutTx(ctx context.Context, tx pgx.Tx, client *river.Client[pgx.Tx]) (int, error) {
	if client == nil {
		return 0, invalidf(ErrInvalidConfig, "client", "is nil")
	}
	sql, err := statementsFor(client.Schema())
	if err != nil {
		return 0, err
	}
	// The relay is borrowed for this call: its run state is set under mu
	// with running, so Start refuses meanwhile, and with inTx, so Stop knows
	// there is no run to stop.
	r.mu.Lock()
	if r.running {
		r.mu.Unlock()
		return 0, fmt.Errorf("%w: FanOutTx is for a relay that is not started", ErrStarted)
	}
	if err := r.lastRunLingers(); err != nil {
		r.mu.Unlock()
		return 0, err
	}
	callbacks := hostcall.Start(ctx, r.logger, callbackQueue)
	r.running, r.inTx = true, true
	r.sql, r.client, r.stopCh, r.callbacks = sql, client, nil, callbacks
	r.mu.Unlock()
	defer func() {
		_ = callbacks.Stop(context.WithoutCancel(ctx)) // waits for OnPoison calls; no deadline
		r.mu.Lock()
		r.running, r.inTx = false, false
		r.mu.Unlock()
	}()
	if err := r.register(ctx, tx); err != nil {
		return 0, err
	}
	n := 0
	for {
		claimed, err := r.roundIn(ctx, tx, lanePending, r.sql.ClaimBatch, int64(r.config.BatchSize))
		n += len(claimed)
		if err != nil {
			return n, fmt.Errorf("events: fan out in tx: %w", err)
		}
		if len(claimed) < r.config.BatchSize {
			return n, nil
		}
	}
}
