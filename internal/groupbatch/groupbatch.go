// Package groupbatch sends the statements that many goroutines want run at
// the same moment as one pgx batch: one round trip, one transaction, one
// backend, as a group commit does. Many workers each completing their own
// job in a statement of their own contend for the same few pages (the
// newest rows of river_job and its indexes, the rows of a small table) and
// pay a round trip each; River's completer batches its completions for the
// same reason.
//
// There is no goroutine of its own: the first caller to find no batch in
// flight sends one with everything queued, and when it is done hands the
// next batch to the first caller still waiting, so no caller works for the
// others longer than one batch.
package groupbatch

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier runs one statement; pgx.Tx and *pgxpool.Pool are ones.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Sender also sends a batch; *pgxpool.Pool is one.
type Sender interface {
	Querier
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Item is one statement and what reads its rows.
type Item struct {
	// Key orders the items of a batch (their row locks are taken in that
	// order, as other writers of the same rows take theirs).
	Key  string
	SQL  string
	Args []any
	// Scan reads the statement's rows; it must be idempotent on failure: it
	// is called again when the batch fails and the item runs alone.
	Scan func(pgx.Rows) error

	err  error
	wake chan bool // true: lead the next batch; false: done
}

// Batcher batches Items. The zero value is not ready: use New.
type Batcher struct {
	db      Sender
	max     int
	timeout time.Duration

	mu      sync.Mutex
	queue   []*Item
	running bool
}

// New returns a Batcher that sends at most max items per batch, each batch
// within timeout.
func New(db Sender, max int, timeout time.Duration) *Batcher {
	return &Batcher{db: db, max: max, timeout: timeout}
}

// Do runs it, in a batch with whatever other callers queued meanwhile, and
// returns its error. It blocks until it ran, whatever ctx does: the
// statement may already be on its way, and its caller must learn its
// outcome. A batch whose transaction fails is rolled back and its items run
// again, each alone.
func (b *Batcher) Do(ctx context.Context, it *Item) error {
	it.wake = make(chan bool, 1)
	b.mu.Lock()
	b.queue = append(b.queue, it)
	if b.running {
		b.mu.Unlock()
		if !<-it.wake {
			return it.err
		}
		b.mu.Lock() // the previous leader handed over
	} else {
		b.running = true
	}
	items := b.queue[:min(len(b.queue), b.max)]
	b.queue = slices.Clone(b.queue[len(items):])
	b.mu.Unlock()

	b.run(ctx, items)

	b.mu.Lock()
	if len(b.queue) > 0 {
		b.queue[0].wake <- true
	} else {
		b.running = false
	}
	b.mu.Unlock()
	for _, x := range items {
		if x != it {
			x.wake <- false
		}
	}
	return it.err
}

// run sends items as one batch, or, if that fails, each alone.
func (b *Batcher) run(ctx context.Context, items []*Item) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.timeout)
	defer cancel()
	if len(items) == 1 {
		items[0].err = Run(ctx, b.db, items[0])
		return
	}
	slices.SortStableFunc(items, func(x, y *Item) int { return cmp.Compare(x.Key, y.Key) })
	var batch pgx.Batch
	for _, it := range items {
		batch.Queue(it.SQL, it.Args...)
	}
	err := func() error {
		br := b.db.SendBatch(ctx, &batch)
		for _, it := range items {
			rows, err := br.Query()
			if err == nil {
				err = scanAll(rows, it.Scan)
			}
			if err != nil {
				_ = br.Close()
				return err
			}
		}
		return br.Close()
	}()
	if err == nil {
		return
	}
	if !retryAlone(err) {
		for _, it := range items {
			it.err = err
		}
		return
	}
	for _, it := range items {
		it.err = Run(ctx, b.db, it)
	}
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

func scanAll(rows pgx.Rows, scan func(pgx.Rows) error) error {
	err := scan(rows)
	rows.Close()
	if err != nil {
		return err
	}
	return rows.Err()
}
