// Package groupbatch sends the statements that many goroutines want run at
// the same moment as one pgx batch: one round trip, one transaction, one
// backend, as a group commit does. Many workers each completing their own
// job in a statement of their own contend for the same few pages (the
// newest rows of river_job and its indexes, the rows of a small table) and
// pay a round trip each (a batch costs two: its statements, its commit); River's completer batches its completions for the
// same reason.
//
// There is no goroutine of its own: a caller that finds a lane free sends
// a batch with everything queued, and when it is done hands the next batch
// (and the lane) to the first caller still waiting, so no caller works for
// the others longer than one batch.
package groupbatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Querier runs one statement; pgx.Tx and *pgxpool.Pool are ones.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Sender also lends a connection for a batch; *pgxpool.Pool is one.
type Sender interface {
	Querier
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Item is one statement and what reads its rows.
type Item struct {
	// Key orders the items of a batch (their row locks are taken in that
	// order, as other writers of the same rows take theirs).
	Key  string
	SQL  string
	Args []any
	// Scan reads the statement's rows; it must start afresh each call: it
	// is called again when the batch fails and the item runs alone.
	Scan func(pgx.Rows) error

	err   error
	wake  chan bool // true: lead batch; false: done
	batch []*Item
}

// rollbackTimeout bounds the ROLLBACK of a failed batch.
const rollbackTimeout = 5 * time.Second

// Batcher batches Items. The zero value is not ready: use New.
type Batcher struct {
	db      Sender
	max     int
	lanes   int
	timeout time.Duration

	mu       sync.Mutex
	queue    []*Item
	inFlight int // batches being sent, at most lanes

	sending func(delta int) // a test's count of batches in flight
}

// New returns a Batcher that sends at most lanes batches at once, each of
// at most max items, within timeout.
func New(db Sender, max, lanes int, timeout time.Duration) *Batcher {
	return &Batcher{db: db, max: max, lanes: lanes, timeout: timeout}
}

// Do runs it, in a batch with whatever other callers queued meanwhile, and
// returns its error. It blocks until it ran, whatever ctx does: the
// statement may already be on its way, and its caller must learn its
// outcome. A batch that fails is rolled back and its items run again, each
// alone (see run).
func (b *Batcher) Do(ctx context.Context, it *Item) error {
	it.wake = make(chan bool, 1)
	b.mu.Lock()
	b.queue = append(b.queue, it)
	var items []*Item
	if b.inFlight >= b.lanes {
		b.mu.Unlock()
		if !<-it.wake {
			return it.err
		}
		items = it.batch // a leader handed this batch, and its lane, over
	} else {
		b.inFlight++
		items = b.takeLocked()
		b.mu.Unlock()
	}

	b.run(ctx, items)

	b.mu.Lock()
	if len(b.queue) > 0 {
		next := b.takeLocked()
		next[0].batch = next
		next[0].wake <- true
	} else {
		b.inFlight--
	}
	b.mu.Unlock()
	for _, x := range items {
		if x != it {
			x.wake <- false
		}
	}
	return it.err
}

// takeLocked takes the next batch off the queue.
func (b *Batcher) takeLocked() []*Item {
	items := b.queue[:min(len(b.queue), b.max)]
	b.queue = slices.Clone(b.queue[len(items):])
	return items
}

// run sends items as one batch, in a transaction it commits only once
// every item's rows were read: when one fails (the server's error, or its
// Scan's), the batch is rolled back and each item runs again alone. When
// the commit's outcome is unknown (the connection lost, the time up), every
// item fails and none runs again: the batch may have committed.
func (b *Batcher) run(ctx context.Context, items []*Item) {
	ctx = context.WithoutCancel(ctx)
	batchCtx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	slices.SortStableFunc(items, func(x, y *Item) int { return cmp.Compare(x.Key, y.Key) })
	if len(items) == 1 { // alone: one round trip, in a transaction of its own
		items[0].err = Run(batchCtx, b.db, items[0])
		return
	}
	if b.sending != nil {
		b.sending(1)
		defer b.sending(-1)
	}
	sure, err := b.send(batchCtx, items)
	switch {
	case err == nil:
	case sure && retryAlone(err):
		// At once, each within its own time: one that waits on a lock
		// holds up no other.
		var wg sync.WaitGroup
		for _, it := range items {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(ctx, b.timeout)
				defer cancel()
				it.err = Run(ctx, b.db, it)
			})
		}
		wg.Wait()
	default:
		for _, it := range items {
			it.err = err
		}
	}
}

// send runs items in one transaction and reports its error, if any, and
// whether the transaction surely did not commit then (sure).
func (b *Batcher) send(ctx context.Context, items []*Item) (sure bool, err error) {
	conn, err := b.db.Acquire(ctx)
	if err != nil {
		return true, err
	}
	// A connection left in a transaction is closed, not pooled, on release.
	defer conn.Release()
	batch := &pgx.Batch{}
	// READ COMMITTED whatever the database's default: the statements lock
	// rows that other transactions update meanwhile, and under REPEATABLE
	// READ such a lock fails (40001) instead of waiting.
	batch.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	// An item that waits long on a lock fails the batch, not the batch's
	// time: the others then run alone, without waiting for it.
	batch.Queue(fmt.Sprintf("SET LOCAL lock_timeout = %d", max(1, (b.timeout/4).Milliseconds())))
	for _, it := range items {
		batch.Queue(it.SQL, it.Args...)
	}
	err = func() error {
		br := conn.SendBatch(ctx, batch)
		defer func() { _ = br.Close() }()
		for range 2 { // BEGIN, SET
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		for _, it := range items {
			rows, err := br.Query()
			if err == nil {
				err = scanAll(rows, it.Scan)
			}
			if err != nil {
				return err
			}
		}
		return br.Close()
	}()
	if err != nil {
		// COMMIT was not sent: the transaction ends rolled back, by this
		// ROLLBACK or, if it fails, by the connection's close on release.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		_, _ = conn.Exec(rctx, "ROLLBACK")
		return true, err
	}
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		return isServerError(err), err
	}
	return true, nil
}

// isServerError reports whether err is the server's: its transaction was
// rolled back.
func isServerError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr)
}

// retryAlone reports whether a failed batch's items are worth running
// alone: not when the batch's context ended (they would fail the same way).
func retryAlone(err error) bool {
	return !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) && !pgconn.Timeout(err)
}

// Run runs it alone on q.
func Run(ctx context.Context, q Querier, it *Item) error {
	rows, err := q.Query(ctx, it.SQL, it.Args...)
	if err != nil {
		return err
	}
	return scanAll(rows, it.Scan)
}

// scanAll reads rows with scan; a scan that panics fails (the batch is
// other callers' too: a panic must not leave them waiting).
func scanAll(rows pgx.Rows, scan func(pgx.Rows) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			rows.Close()
			err = fmt.Errorf("groupbatch: scanning the rows panicked: %v", p)
		}
	}()
	err = scan(rows)
	rows.Close()
	if err != nil {
		return err
	}
	return rows.Err()
}
