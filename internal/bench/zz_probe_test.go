package bench

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

func TestZZProbeOrdered(t *testing.T) {
	ctx := context.Background()
	h, err := newHarness(ctx, testdb.AdminURL(t))
	require.NoError(t, err)
	defer h.close()
	admin, err := pgxpool.New(ctx, testdb.AdminURL(t))
	require.NoError(t, err)
	defer admin.Close()
	ordered := os.Getenv("PROBE_UNORDERED") == ""
	subjects, _ := strconv.Atoi(os.Getenv("PROBE_SUBJECTS"))
	if subjects == 0 {
		subjects = 100
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	waits := map[string]int{}
	samples := 0
	quiet := os.Getenv("PROBE_QUIET") != ""
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !quiet {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			rows, err := admin.Query(ctx, `SELECT coalesce(wait_event_type,'CPU') || ':' || coalesce(wait_event,'') || ' ' || left(regexp_replace(query, '\s+', ' ', 'g'), 60)
				FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() AND backend_type = 'client backend'`)
			if err != nil {
				continue
			}
			samples++
			for rows.Next() {
				var s string
				_ = rows.Scan(&s)
				waits[s]++
			}
			rows.Close()
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if quiet {
			return
		}
		var db *pgxpool.Pool
		start := time.Now()
		for {
			select {
			case <-stop:
				if db != nil {
					db.Close()
				}
				return
			case <-time.After(250 * time.Millisecond):
			}
			if db == nil {
				var name string
				if admin.QueryRow(ctx, "SELECT datname FROM pg_database WHERE datname LIKE $1 ORDER BY oid DESC LIMIT 1", h.template+"\\_%").Scan(&name) != nil {
					continue
				}
				cfg, _ := pgxpool.ParseConfig(testdb.AdminURL(t))
				cfg.ConnConfig.Database = name
				db, _ = pgxpool.NewWithConfig(ctx, cfg)
			}
			var fanned, done, avail, pend, running, links int
			_ = db.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_events WHERE fanned_out_at IS NOT NULL),
				(SELECT count(*) FROM river_job WHERE state = 'completed'), (SELECT count(*) FROM river_job WHERE state = 'available'),
				(SELECT count(*) FROM river_job WHERE state = 'pending'), (SELECT count(*) FROM river_job WHERE state = 'running'),
				(SELECT count(*) FROM outbox_chain_jobs)`).Scan(&fanned, &done, &avail, &pend, &running, &links)
			fmt.Printf("%5.2fs fanned %6d completed %6d available %4d pending %6d running %3d links %6d\n", time.Since(start).Seconds(), fanned, done, avail, pend, running, links)
		}
	}()
	o := orderedRun{ordered: ordered, subjects: subjects, n: 20000, batch: 200}
	r, err := o.handled(ctx, h)
	close(stop)
	wg.Wait()
	require.NoError(t, err)
	type kv struct {
		k string
		v int
	}
	var l []kv
	for k, v := range waits {
		l = append(l, kv{k, v})
	}
	sort.Slice(l, func(i, j int) bool { return l[i].v > l[j].v })
	fmt.Printf("took %v, %d samples\n", r.took, samples)
	for i, x := range l {
		if i > 25 {
			break
		}
		fmt.Printf("%6.2f %s\n", float64(x.v)/float64(samples), x.k)
	}
}

func TestZZProbeFreshDuringDrain(t *testing.T) {
	ctx := context.Background()
	h, err := newHarness(ctx, testdb.AdminURL(t))
	require.NoError(t, err)
	defer h.close()
	o := Options{AdminURL: testdb.AdminURL(t)}
	o.defaults()
	for range 2 {
		tDrain, during, _, err := owedDrain(ctx, h, o, 40000, false, 200)
		require.NoError(t, err)
		alone, _, err := freshAlone(ctx, h, o, 200, max(tDrain, 2*time.Second))
		require.NoError(t, err)
		d50, _, d99 := percentiles(during)
		a50, _, a99 := percentiles(alone)
		fmt.Printf("drain %v: during p50 %.2f p99 %.2f; alone p50 %.2f p99 %.2f; ratio %.2f\n", tDrain.Round(time.Millisecond), ms(d50), ms(d99), ms(a50), ms(a99), ms(d99)/ms(a99))
	}
}
