package events

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// RecordedInTx is called inside the host's transaction, so it must not make
// the host's transaction fail at SERIALIZABLE either: 16 writers that each
// Record and then ask RecordedInTx what they recorded, on nothing shared of
// their own, must all commit. It reads its own transaction's rows through
// the pending index, and every pending row it scans past (the others'
// inserts) is a read-write conflict with a concurrent writer.
func TestRecordedInTxDoesNotFailSerializableHosts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	const writers, txs = 16, 25
	var failed atomic.Int64
	var firstOnce sync.Once
	var first error
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range writers {
		wg.Go(func() {
			<-start
			for range txs {
				err := pgx.BeginTxFunc(ctx, b.pool, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
						return err
					}
					time.Sleep(time.Millisecond) // workload think time, as in the isolation matrix
					if _, err := Record(ctx, tx, Event{Type: "a"}); err != nil {
						return err
					}
					es, err := RecordedInTx(ctx, tx)
					if err == nil && len(es) != 1 {
						t.Errorf("RecordedInTx found %d events", len(es))
					}
					return err
				})
				if err != nil {
					failed.Add(1)
					firstOnce.Do(func() { first = err })
				}
			}
		})
	}
	close(start)
	wg.Wait()
	require.Zero(t, failed.Load(), "%d of %d serializable transactions failed; first: %v", failed.Load(), writers*txs, first)
}
