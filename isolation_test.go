package events

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// The host's transaction is never put at risk: at every isolation level, 16
// writers each updating rows of their own and recording events by every
// write path fail exactly as often as the same transactions without the
// library — never. (The SQL paths used to claim a shared settings row inside
// the host's transaction; under REPEATABLE READ most writers then failed
// with 40001.) And every committed event is fanned out.
func TestEveryWritePathAtEveryIsolationLevel(t *testing.T) {
	t.Parallel()
	const (
		writers = 16
		txs     = 25
	)
	paths := []struct {
		name  string
		write func(ctx context.Context, tx pgx.Tx, row int) error
	}{
		{"no library", func(ctx context.Context, tx pgx.Tx, row int) error {
			_, err := tx.Exec(ctx, "UPDATE plain_notes SET title = title || '!' WHERE id = $1", row)
			return err
		}},
		{"Record", func(ctx context.Context, tx pgx.Tx, row int) error {
			if _, err := tx.Exec(ctx, "UPDATE plain_notes SET title = title || '!' WHERE id = $1", row); err != nil {
				return err
			}
			_, err := Record(ctx, tx, Event{Type: "note.changed", Subject: fmt.Sprint("note:", row)})
			return err
		}},
		{"RecordMany", func(ctx context.Context, tx pgx.Tx, row int) error {
			if _, err := tx.Exec(ctx, "UPDATE plain_notes SET title = title || '!' WHERE id = $1", row); err != nil {
				return err
			}
			_, err := RecordMany(ctx, tx, []Event{{Type: "note.changed"}, {Type: "note.touched"}})
			return err
		}},
		{"outbox_record", func(ctx context.Context, tx pgx.Tx, row int) error {
			_, err := tx.Exec(ctx, "UPDATE plain_notes SET title = title || '!' WHERE id = $1", row)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, "SELECT outbox_record('note.changed', $1)", fmt.Sprint("note:", row))
			return err
		}},
		{"watch trigger", func(ctx context.Context, tx pgx.Tx, row int) error {
			_, err := tx.Exec(ctx, "UPDATE corpus_notes SET title = title || '!' WHERE id = $1", row)
			return err
		}},
	}
	levels := []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}
	for _, level := range levels {
		for _, path := range paths {
			t.Run(fmt.Sprintf("%s/%s", level, path.name), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
				// A host workload that does not fail on its own: enough rows,
				// analysed, for the planner to update by the primary key (a
				// sequential scan takes a predicate lock on the whole table),
				// and room in the pages for HOT updates (an index entry added
				// to a leaf page another SERIALIZABLE writer read is a
				// conflict), so that these writers never fail among
				// themselves, library or not.
				createNotes(t, b.pool, 20_000)
				exec(t, b.pool, "CREATE TABLE plain_notes (id int PRIMARY KEY, title text NOT NULL) WITH (fillfactor = 50)")
				exec(t, b.pool, "INSERT INTO plain_notes SELECT g, 'note' FROM generate_series(1, 20000) g")
				exec(t, b.pool, "ALTER TABLE corpus_notes SET (fillfactor = 50)")
				exec(t, b.pool, "VACUUM FULL corpus_notes")
				exec(t, b.pool, "ANALYZE corpus_notes, plain_notes")
				require.NoError(t, outbox.InstallWatch(ctx, b.pool, Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed"}}))
				// Every SQL-side transaction would notify if the throttle
				// let it: the throttle must decide without a shared row.
				exec(t, b.pool, "UPDATE outbox_settings SET notify_interval = '1 millisecond'")

				var failed, committed atomic.Int64
				var firstErr sync.Once
				var errSeen error
				start := make(chan struct{})
				var wg sync.WaitGroup
				for w := range writers {
					wg.Go(func() {
						<-start
						for i := range txs {
							row := 1 + w*txs + i
							err := pgx.BeginTxFunc(ctx, b.pool, pgx.TxOptions{IsoLevel: level}, func(tx pgx.Tx) error {
								// Take the snapshot first, then give others
								// time to commit past it: the window in which
								// a shared row updated by a committed writer
								// raised 40001.
								if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
									return err
								}
								time.Sleep(time.Millisecond) // workload think time, not a wait for a condition
								return path.write(ctx, tx, row)
							})
							if err != nil {
								failed.Add(1)
								firstErr.Do(func() { errSeen = err })
								continue
							}
							committed.Add(1)
						}
					})
				}
				close(start)
				wg.Wait()
				var pgErr *pgconn.PgError
				if errors.As(errSeen, &pgErr) {
					t.Logf("first failure: %s %s", pgErr.Code, pgErr.Message)
				}
				require.Zero(t, failed.Load(), "%s at %s: %d of %d transactions failed (first: %v); without the library none do",
					path.name, level, failed.Load(), writers*txs, errSeen)
				if errSeen != nil && pgErr != nil {
					require.NotEqual(t, pgerrcode.SerializationFailure, pgErr.Code)
				}
				if path.name == "no library" {
					return
				}
				b.start(t)
				waitFannedOut(t, b.pool, 30*time.Second)
				var n int64
				require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE fanned_out_at IS NOT NULL").Scan(&n))
				perTx := int64(1)
				if path.name == "RecordMany" {
					perTx = 2
				}
				require.Equal(t, committed.Load()*perTx, n, "every committed event is fanned out")
			})
		}
	}
}
