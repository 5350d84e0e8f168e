package bench

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/pgtest"
)

// The host's write path under concurrency, on a server with production
// durability (fsync and synchronous_commit on): a transaction that has run
// pg_notify takes a cluster-wide lock at commit and holds it through its WAL
// flush, which a server with fsync off never shows.

// writeVariant is one kind of host transaction.
type writeVariant struct {
	name string
	tx   func(ctx context.Context, tx pgx.Tx, i int) error
}

func writeVariants() []writeVariant {
	update := func(ctx context.Context, tx pgx.Tx, i int) error {
		_, err := tx.Exec(ctx, "UPDATE bench_accounts SET balance = balance + 1 WHERE id = $1", 1+i%1000)
		return err
	}
	return []writeVariant{
		{"(a) UPDATE only", update},
		{"(b) UPDATE + plain outbox INSERT", func(ctx context.Context, tx pgx.Tx, i int) error {
			if err := update(ctx, tx, i); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO outbox_events (id, type, subject, payload) VALUES ($1, 'account.changed', $2, '{}')",
				uuid.Must(uuid.NewV7()), fmt.Sprintf("account:%d", 1+i%1000))
			return err
		}},
		{"(c) UPDATE + Record", func(ctx context.Context, tx pgx.Tx, i int) error {
			if err := update(ctx, tx, i); err != nil {
				return err
			}
			_, err := events.Record(ctx, tx, events.Event{Type: "account.changed", Subject: fmt.Sprintf("account:%d", 1+i%1000)})
			return err
		}},
		{"(d) UPDATE of a watched table (trigger)", func(ctx context.Context, tx pgx.Tx, i int) error {
			_, err := tx.Exec(ctx, "UPDATE bench_watched SET balance = balance + 1 WHERE id = $1", 1+i%1000)
			return err
		}},
		{"(e) UPDATE + Record, notify in every tx", func(ctx context.Context, tx pgx.Tx, i int) error {
			if err := update(ctx, tx, i); err != nil {
				return err
			}
			_, err := events.Outbox{NotifyInterval: events.NotifyEveryTransaction}.Record(ctx, tx,
				events.Event{Type: "account.changed", Subject: fmt.Sprintf("account:%d", 1+i%1000)})
			return err
		}},
	}
}

const writers = 32

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
	rates := make([][]float64, len(variants))
	p99s := make([][]float64, len(variants))
	for round := range o.writeRounds() {
		for k := range variants {
			i := (k + round) % len(variants)
			rate, p99, err := writeOnce(ctx, h, o, variants[i])
			if err != nil {
				return fmt.Errorf("%s: %w", variants[i].name, err)
			}
			fmt.Fprintf(o.Log, "%-42s %8.0f commits/s  p99 commit %6.2f ms\n", variants[i].name, rate, p99)
			rates[i] = append(rates[i], rate)
			p99s[i] = append(p99s[i], p99)
		}
	}
	med := make([]float64, len(variants))
	for i, v := range variants {
		med[i] = median(rates[i])
		rep.add("writepath", v.name+" commits/s", med[i], "commits/s")
		rep.add("writepath", v.name+" p99 commit", median(p99s[i]), "ms")
	}
	rep.addTarget("writepath", "(c) Record ÷ (b) plain INSERT", med[2]/med[1], "×", "≥ 0.9", med[2]/med[1] >= 0.9)
	rep.addTarget("writepath", "(d) trigger ÷ (b) plain INSERT", med[3]/med[1], "×", "≥ 0.85", med[3]/med[1] >= 0.85)
	rep.add("writepath", "(e) notify every tx ÷ (b) plain INSERT", med[4]/med[1], "×")

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

// writeOnce runs writers host transactions of v for o.WriteFor on a fresh
// database, and returns commits/s and the p99 of COMMIT's duration in ms.
func writeOnce(ctx context.Context, h *harness, o Options, v writeVariant) (float64, float64, error) {
	pool, err := h.database(ctx, writers+2)
	if err != nil {
		return 0, 0, err
	}
	defer h.drop(ctx)
	defer pool.Close()
	var (
		mu      sync.Mutex
		commits []time.Duration
	)
	deadline := time.Now().Add(o.WriteFor)
	start := time.Now()
	var g errgroup.Group
	for w := range writers {
		g.Go(func() error {
			var mine []time.Duration
			for i := w; time.Now().Before(deadline); i += writers {
				tx, err := pool.Begin(ctx)
				if err != nil {
					return err
				}
				if err := v.tx(ctx, tx, i); err != nil {
					_ = tx.Rollback(ctx)
					return err
				}
				t0 := time.Now()
				if err := tx.Commit(ctx); err != nil {
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
		return 0, 0, err
	}
	elapsed := time.Since(start)
	sort.Slice(commits, func(i, j int) bool { return commits[i] < commits[j] })
	_, _, p99 := percentiles(commits)
	return float64(len(commits)) / elapsed.Seconds(), ms(p99), nil
}
