package bench

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"golang.org/x/sync/errgroup"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/pgtest"
)

// The host's write path under concurrency, on a server with production
// durability (fsync and synchronous_commit on): a transaction that has run
// pg_notify takes a cluster-wide lock at commit and holds it through its WAL
// flush, which a server with fsync off never shows.

// writeVariant is one kind of host transaction. row is a row of the
// writer's own (writers never share rows, so no isolation level makes them
// conflict among themselves); client inserts River jobs for the baseline a
// River user writes by hand.
type writeVariant struct {
	name string
	tx   func(ctx context.Context, tx pgx.Tx, client *river.Client[pgx.Tx], row int) error
}

func writeVariants() []writeVariant {
	update := func(ctx context.Context, tx pgx.Tx, row int) error {
		_, err := tx.Exec(ctx, "UPDATE bench_accounts SET balance = balance + 1 WHERE id = $1", row)
		return err
	}
	subject := func(row int) string { return fmt.Sprintf("account:%d", row) }
	return []writeVariant{
		{"(a) UPDATE only", func(ctx context.Context, tx pgx.Tx, _ *river.Client[pgx.Tx], row int) error {
			return update(ctx, tx, row)
		}},
		{"(b) UPDATE + plain outbox INSERT", func(ctx context.Context, tx pgx.Tx, _ *river.Client[pgx.Tx], row int) error {
			if err := update(ctx, tx, row); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO outbox_events (id, type, subject, payload) VALUES ($1, 'account.changed', $2, '{}')",
				uuid.Must(uuid.NewV7()), subject(row))
			return err
		}},
		{"(c) UPDATE + Record", func(ctx context.Context, tx pgx.Tx, _ *river.Client[pgx.Tx], row int) error {
			if err := update(ctx, tx, row); err != nil {
				return err
			}
			_, err := events.Record(ctx, tx, events.Event{Type: "account.changed", Subject: subject(row)})
			return err
		}},
		{"(d) UPDATE + RecordMany (1 event)", func(ctx context.Context, tx pgx.Tx, _ *river.Client[pgx.Tx], row int) error {
			if err := update(ctx, tx, row); err != nil {
				return err
			}
			_, err := events.RecordMany(ctx, tx, []events.Event{{Type: "account.changed", Subject: subject(row)}})
			return err
		}},
		{"(e) UPDATE + outbox_record()", func(ctx context.Context, tx pgx.Tx, _ *river.Client[pgx.Tx], row int) error {
			if err := update(ctx, tx, row); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "SELECT outbox_record('account.changed', $1)", subject(row))
			return err
		}},
		{"(f) UPDATE of a watched table (trigger)", func(ctx context.Context, tx pgx.Tx, _ *river.Client[pgx.Tx], row int) error {
			_, err := tx.Exec(ctx, "UPDATE bench_watched SET balance = balance + 1 WHERE id = $1", row)
			return err
		}},
		{"(f0) UPDATE of a watched table, generic trigger function", func(ctx context.Context, tx pgx.Tx, _ *river.Client[pgx.Tx], row int) error {
			_, err := tx.Exec(ctx, "UPDATE bench_watched_generic SET balance = balance + 1 WHERE id = $1", row)
			return err
		}},
		{"(g) UPDATE + Record, notify in every tx", func(ctx context.Context, tx pgx.Tx, _ *river.Client[pgx.Tx], row int) error {
			if err := update(ctx, tx, row); err != nil {
				return err
			}
			_, err := events.Outbox{NotifyInterval: events.NotifyEveryTransaction}.Record(ctx, tx,
				events.Event{Type: "account.changed", Subject: subject(row)})
			return err
		}},
		{"(h) UPDATE + River InsertManyTx of the 3 jobs", func(ctx context.Context, tx pgx.Tx, client *river.Client[pgx.Tx], row int) error {
			if err := update(ctx, tx, row); err != nil {
				return err
			}
			_, err := client.InsertManyTx(ctx, tx, jobParams(nil, uuid.Must(uuid.NewV7()), subject(row)))
			return err
		}},
	}
}

const writers = 32

// rowsPerWriter is how many rows of bench_accounts (and bench_watched) each
// writer has to itself: writers*rowsPerWriter ≤ 1000.
const rowsPerWriter = 31

var isoLevels = []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead}

func runWritePath(ctx context.Context, _ *harness, o Options, rep *Report) error {
	c, err := pgtest.StartDurable(ctx)
	if err != nil {
		return fmt.Errorf("a server with fsync on: %w", err)
	}
	defer c.Close()
	h, err := newHarness(ctx, c.URL("postgres"))
	if err != nil {
		return err
	}
	defer h.close()
	var fsync, syncCommit string
	if err := h.admin.QueryRow(ctx, "SELECT current_setting('fsync'), current_setting('synchronous_commit')").Scan(&fsync, &syncCommit); err != nil {
		return err
	}
	fmt.Fprintf(o.Log, "server: fsync=%s synchronous_commit=%s, %d writers, %v per run\n", fsync, syncCommit, writers, o.WriteFor)
	rep.add("writepath", "server fsync="+fsync+", synchronous_commit="+syncCommit, writers, "writers")

	variants := writeVariants()
	for _, level := range isoLevels {
		rates := make([][]float64, len(variants))
		p99s := make([][]float64, len(variants))
		failed := make([]int, len(variants))
		for round := range o.writeRounds() {
			for k := range variants {
				i := (k + round) % len(variants)
				res, err := writeOnce(ctx, h, o, variants[i], level)
				if err != nil {
					return fmt.Errorf("%s at %s: %w", variants[i].name, level, err)
				}
				fmt.Fprintf(o.Log, "%-16s %-48s %8.0f commits/s  p99 commit %6.2f ms  %d failed\n", level, variants[i].name, res.rate, res.p99, res.failed)
				rates[i] = append(rates[i], res.rate)
				p99s[i] = append(p99s[i], res.p99)
				failed[i] += res.failed
			}
		}
		med := make([]float64, len(variants))
		// ratio is the median over rounds of v's rate ÷ base's in the same
		// round: on a host whose disk and neighbours drift by ±15 % between
		// runs, pairing within a round cancels what drifts slowly.
		ratio := func(v, base int) float64 {
			per := make([]float64, len(rates[v]))
			for r := range per {
				per[r] = rates[v][r] / rates[base][r]
			}
			return median(per)
		}
		at := " (" + string(level) + ")"
		for i, v := range variants {
			med[i] = median(rates[i])
			rep.add("writepath", v.name+" commits/s"+at, med[i], "commits/s")
			rep.add("writepath", v.name+" p99 commit"+at, median(p99s[i]), "ms")
			if i > 0 {
				rep.addTarget("writepath", v.name+" failed transactions"+at, float64(failed[i]), "",
					fmt.Sprintf("= (a)'s (%d)", failed[0]), failed[i] == failed[0])
			}
		}
		rep.addTarget("writepath", "(c) Record ÷ (b) plain INSERT"+at, ratio(2, 1), "×", "≥ 0.9", ratio(2, 1) >= 0.9)
		rep.add("writepath", "(d) RecordMany ÷ (b) plain INSERT"+at, ratio(3, 1), "×")
		rep.add("writepath", "(e) outbox_record() ÷ (b) plain INSERT"+at, ratio(4, 1), "×")
		rep.addTarget("writepath", "(f) trigger ÷ (b) plain INSERT"+at, ratio(5, 1), "×", "≥ 0.9", ratio(5, 1) >= 0.9)
		rep.add("writepath", "(f0) generic trigger function ÷ (b) plain INSERT"+at, ratio(6, 1), "×")
		rep.add("writepath", "(f) trigger ÷ (f0) generic trigger function"+at, ratio(5, 6), "×")
		rep.add("writepath", "(g) notify every tx ÷ (b) plain INSERT"+at, ratio(7, 1), "×")
		rep.add("writepath", "(c) Record ÷ (h) River InsertManyTx"+at, ratio(2, 8), "×")
	}

	// Commit-to-fanned latency at 200/s on this server too.
	if len(o.Rates) > 0 {
		lo := o
		lo.Rates = []int{o.Rates[0]}
		if err := withRelay(ctx, h, lo, int32(max(2, lo.Rates[0]/100)+10), func(pool *pgxpool.Pool) error {
			return measureLatencySection(ctx, pool, lo, lo.Rates[0], max(2, lo.Rates[0]/100), rep, "writepath", " (fsync on)")
		}); err != nil {
			return err
		}
	}
	return nil
}

type writeResult struct {
	rate   float64 // commits/s
	p99    float64 // of COMMIT, ms
	failed int     // transactions that failed with a serialization failure
}

// writeOnce runs writers host transactions of v at level for o.WriteFor on a
// fresh database, and returns commits/s, the p99 of COMMIT's duration and
// how many transactions failed with a serialization failure (any other
// error ends the run).
func writeOnce(ctx context.Context, h *harness, o Options, v writeVariant, level pgx.TxIsoLevel) (writeResult, error) {
	pool, err := h.database(ctx, writers+2)
	if err != nil {
		return writeResult{}, err
	}
	defer h.drop(ctx)
	defer pool.Close()
	client, err := riverClient(pool)
	if err != nil {
		return writeResult{}, err
	}
	// The last run's database was dropped (a checkpoint) and this one copied
	// from the template: flush what the kernel still holds of that, so its
	// writeback does not compete with this run's WAL flushes.
	syscall.Sync()
	var (
		mu      sync.Mutex
		commits []time.Duration
		failed  atomic.Int64
	)
	deadline := time.Now().Add(o.WriteFor)
	start := time.Now()
	var g errgroup.Group
	for w := range writers {
		g.Go(func() error {
			var mine []time.Duration
			for k := 0; time.Now().Before(deadline); k++ {
				row := 1 + w*rowsPerWriter + k%rowsPerWriter
				tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: level})
				if err != nil {
					return err
				}
				err = v.tx(ctx, tx, client, row)
				var t0 time.Time
				if err == nil {
					t0 = time.Now()
					err = tx.Commit(ctx)
				}
				if err != nil {
					_ = tx.Rollback(ctx)
					var pgErr *pgconn.PgError
					if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.SerializationFailure {
						failed.Add(1)
						continue
					}
					return err
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			commits = append(commits, mine...)
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return writeResult{}, err
	}
	elapsed := time.Since(start)
	sort.Slice(commits, func(i, j int) bool { return commits[i] < commits[j] })
	_, _, p99 := percentiles(commits)
	return writeResult{rate: float64(len(commits)) / elapsed.Seconds(), p99: ms(p99), failed: int(failed.Load())}, nil
}
