package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"golang.org/x/sync/errgroup"

	"github.com/standmeet/events"
)

// JobArgs is the job every benchmark variant inserts, one per event and
// subscriber, so the variants insert the same rows.
type JobArgs struct {
	EventID    uuid.UUID `json:"event_id"`
	Subject    string    `json:"subject"`
	Subscriber string    `json:"subscriber"`
}

// Kind is the River kind of benchmark jobs.
func (JobArgs) Kind() string { return "bench.job" }

var subscriberNames = []string{"webhooks", "mail", "search"}

func subscribers() []events.Subscriber {
	subs := make([]events.Subscriber, len(subscriberNames))
	for i, name := range subscriberNames {
		subs[i] = events.Subscriber{Name: name, Types: []string{"**"}, Coalesce: name == "search",
			Map: func(_ context.Context, e events.Event) (river.JobArgs, *river.InsertOpts, error) {
				return JobArgs{EventID: e.ID, Subject: e.Subject, Subscriber: name}, nil, nil
			}}
	}
	return subs
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// jobParams are the jobs baselines insert for one event: the rows the relay
// inserts, tags included, so every variant writes the same river_job rows.
func jobParams(dst []river.InsertManyParams, id uuid.UUID, subject string) []river.InsertManyParams {
	for _, s := range subscriberNames {
		dst = append(dst, river.InsertManyParams{
			Args:       JobArgs{EventID: id, Subject: subject, Subscriber: s},
			InsertOpts: &river.InsertOpts{Tags: []string{"events-subscriber-" + s}},
		})
	}
	return dst
}

// backlog records n events in transactions of 2,000. Subjects repeat only
// every n/2 events, so no batch holds two events of one subject: every
// variant inserts exactly three jobs per event and the comparison is like for
// like (coalescing still runs; it folds nothing).
func backlog(ctx context.Context, pool *pgxpool.Pool, n int) error {
	for done := 0; done < n; {
		size := min(2000, n-done)
		es := make([]events.Event, size)
		for i := range es {
			es[i] = events.Event{Type: "order.placed", Subject: fmt.Sprintf("order:%d", (done+i)%max(n/2, 1)),
				Payload: []byte(`{"amount_cents":1299,"currency":"EUR"}`)}
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := events.RecordMany(ctx, tx, es)
			return err
		}); err != nil {
			return err
		}
		done += size
	}
	return nil
}

func riverClient(pool *pgxpool.Pool) (*river.Client[pgx.Tx], error) {
	return river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quiet})
}

func pending(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	var any bool
	err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM outbox_events WHERE fanned_out_at IS NULL AND poisoned_at IS NULL)").Scan(&any)
	return any, err
}

// drainWithRelays times relays (with the default rounds in flight) draining
// the backlog in pool.
func drainWithRelays(ctx context.Context, pool *pgxpool.Pool, relays, batch int) (time.Duration, error) {
	return drainWithRelaysRounds(ctx, pool, relays, batch, 0)
}

// drainWithRelaysRounds is drainWithRelays with rounds in flight per relay (0:
// the default).
func drainWithRelaysRounds(ctx context.Context, pool *pgxpool.Pool, relays, batch, rounds int) (time.Duration, error) {
	client, err := riverClient(pool)
	if err != nil {
		return 0, err
	}
	var rs []*events.Relay
	for range relays {
		r, err := events.NewRelay(pool, &events.RelayConfig{BatchSize: batch, MaxRoundsInFlight: rounds, Logger: quiet})
		if err != nil {
			return 0, err
		}
		for _, s := range subscribers() {
			if err := r.Subscribe(s); err != nil {
				return 0, err
			}
		}
		rs = append(rs, r)
	}
	start := time.Now()
	for _, r := range rs {
		if err := r.Start(ctx, client); err != nil {
			return 0, err
		}
	}
	defer func() {
		for _, r := range rs {
			_ = r.Stop(ctx)
		}
	}()
	for {
		more, err := pending(ctx, pool)
		if err != nil {
			return 0, err
		}
		if !more {
			return time.Since(start), nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type claimed struct {
	seq     int64
	id      uuid.UUID
	subject string
}

// drainBare is baseline (b): the same claim → InsertManyTx → stamp → commit
// loop written directly against pgx and River, with no library code, run by
// workers goroutines at once.
func drainBare(ctx context.Context, pool *pgxpool.Pool, workers, batch int) (time.Duration, error) {
	client, err := riverClient(pool)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	var g errgroup.Group
	for range workers {
		g.Go(func() error {
			for {
				n := 0
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					rows, err := tx.Query(ctx, `SELECT seq, id, subject FROM outbox_events
						WHERE fanned_out_at IS NULL AND poisoned_at IS NULL ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED`, batch)
					if err != nil {
						return err
					}
					rs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimed, error) {
						var c claimed
						return c, row.Scan(&c.seq, &c.id, &c.subject)
					})
					if err != nil || len(rs) == 0 {
						return err
					}
					n = len(rs)
					params := make([]river.InsertManyParams, 0, len(rs)*len(subscriberNames))
					for _, c := range rs {
						params = jobParams(params, c.id, c.subject)
					}
					res, err := client.InsertManyTx(ctx, tx, params)
					if err != nil {
						return err
					}
					seqs := make([]int64, len(rs))
					fanouts := make([]string, len(rs))
					for i, c := range rs {
						seqs[i] = c.seq
						j := i * len(subscriberNames)
						fanouts[i] = fmt.Sprintf(`{"webhooks":%d,"mail":%d,"search":%d}`, res[j].Job.ID, res[j+1].Job.ID, res[j+2].Job.ID)
					}
					_, err = tx.Exec(ctx, `UPDATE outbox_events e SET fanned_out_at = now(), fanout = u.f::jsonb
						FROM unnest($1::bigint[], $2::text[]) u(seq, f) WHERE e.seq = u.seq`, seqs, fanouts)
					return err
				})
				if err != nil || n == 0 {
					return err
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// insertOnly is baseline (a): River's InsertManyTx inserting the same jobs in
// transactions of the same batch size, with no claiming and no stamping.
func insertOnly(ctx context.Context, pool *pgxpool.Pool, workers, batch int) (time.Duration, error) {
	client, err := riverClient(pool)
	if err != nil {
		return 0, err
	}
	rows, err := pool.Query(ctx, "SELECT seq, id, subject FROM outbox_events ORDER BY seq")
	if err != nil {
		return 0, err
	}
	all, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimed, error) {
		var c claimed
		return c, row.Scan(&c.seq, &c.id, &c.subject)
	})
	if err != nil {
		return 0, err
	}
	work := make(chan []claimed, len(all)/batch+1)
	for i := 0; i < len(all); i += batch {
		work <- all[i:min(i+batch, len(all))]
	}
	close(work)
	start := time.Now()
	var g errgroup.Group
	for range workers {
		g.Go(func() error {
			for chunk := range work {
				params := make([]river.InsertManyParams, 0, len(chunk)*len(subscriberNames))
				for _, c := range chunk {
					params = jobParams(params, c.id, c.subject)
				}
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := client.InsertManyTx(ctx, tx, params)
					return err
				}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// checkFanout counts events that are not fanned out with exactly one job per
// subscriber, each naming an existing job of that subscriber and event.
func checkFanout(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var bad int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events e
		WHERE e.fanned_out_at IS NULL
		   OR (SELECT count(*) FROM jsonb_each(e.fanout)) <> 3
		   OR EXISTS (SELECT 1 FROM jsonb_each_text(e.fanout) f
		              WHERE NOT EXISTS (SELECT 1 FROM river_job j WHERE j.id = f.value::bigint
		                                  AND j.args->>'subscriber' = f.key AND j.args->>'subject' = e.subject))`).Scan(&bad)
	if err != nil {
		return 0, err
	}
	var jobs, evs int
	if err := pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM river_job), (SELECT count(*) FROM outbox_events)").Scan(&jobs, &evs); err != nil {
		return 0, err
	}
	if jobs != 3*evs {
		bad += abs(jobs - 3*evs)
	}
	return bad, nil
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// throughputRounds is how many times each variant drains a backlog; the
// median counts. On a 2-core machine shared by PostgreSQL and the benchmark,
// single runs vary by ±15%.
func (o Options) throughputRounds() int {
	if o.Events < 10_000 {
		return 1
	}
	return 3
}

func runThroughput(ctx context.Context, h *harness, o Options, rep *Report) error {
	jobsPerEvent := float64(len(subscriberNames))
	type variant struct {
		name   string
		drain  func(context.Context, *pgxpool.Pool, int, int) (time.Duration, error)
		verify bool
	}
	oneRound := func(ctx context.Context, pool *pgxpool.Pool, relays, batch int) (time.Duration, error) {
		return drainWithRelaysRounds(ctx, pool, relays, batch, 1)
	}
	variants := []variant{
		{fmt.Sprintf("relay (%d rounds in flight)", events.MaxRoundsInFlightDefault), drainWithRelays, true},
		{"relay (1 round in flight)", oneRound, true},
		{"(a) River InsertManyTx only", insertOnly, false},
		{"(b) bare SKIP LOCKED loop", drainBare, true},
	}
	for _, workers := range []int{1, 2} {
		rates := make([][]float64, len(variants))
		for round := range o.throughputRounds() {
			for k := range variants {
				// Rotate the order so no variant always runs first.
				i := (k + round) % len(variants)
				v := variants[i]
				rate, err := drainOnce(ctx, h, o, workers, v.drain, v.verify, rep)
				if err != nil {
					return fmt.Errorf("%s: %w", v.name, err)
				}
				fmt.Fprintf(o.Log, "%-30s %d worker(s): %8.0f events/s  %8.0f jobs/s\n", v.name, workers, rate, rate*jobsPerEvent)
				rates[i] = append(rates[i], rate)
			}
		}
		relay, single, insert, bare := median(rates[0]), median(rates[1]), median(rates[2]), median(rates[3])
		sfx := fmt.Sprintf(", %d relay(s)", workers)
		rep.add("throughput", "relay events/s"+sfx, relay, "events/s")
		rep.add("throughput", "relay jobs/s"+sfx, relay*jobsPerEvent, "jobs/s")
		rep.add("throughput", "relay, 1 round in flight, events/s"+sfx, single, "events/s")
		rep.add("throughput", "(a) InsertManyTx events/s"+sfx, insert, "events/s")
		rep.add("throughput", "(b) bare loop events/s"+sfx, bare, "events/s")
		if workers == 1 {
			rep.addTarget("throughput", "relay ÷ (a) InsertManyTx"+sfx, relay/insert, "×", "≥ 0.85", relay/insert >= 0.85)
		} else {
			rep.add("throughput", "relay ÷ (a) InsertManyTx"+sfx, relay/insert, "×")
		}
		rep.add("throughput", "relay, 1 round ÷ (a) InsertManyTx"+sfx, single/insert, "×")
		rep.addTarget("throughput", "relay, 1 round ÷ (b) bare loop"+sfx, single/bare, "×", "≥ 0.9", single/bare >= 0.9)
	}
	return nil
}

// drainOnce loads a backlog into a fresh database and times one drain.
func drainOnce(ctx context.Context, h *harness, o Options, workers int,
	drain func(context.Context, *pgxpool.Pool, int, int) (time.Duration, error), verify bool, rep *Report,
) (float64, error) {
	pool, err := h.database(ctx, 20)
	if err != nil {
		return 0, err
	}
	defer h.drop(ctx)
	defer pool.Close()
	if err := backlog(ctx, pool, o.Events); err != nil {
		return 0, err
	}
	// Start every drain from the same state: statistics fresh, no dirty
	// buffers from loading.
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE outbox_events"); err != nil {
		return 0, err
	}
	_, _ = pool.Exec(ctx, "CHECKPOINT") // superuser only; best effort
	d, err := drain(ctx, pool, workers, o.Batch)
	if err != nil {
		return 0, err
	}
	if verify {
		bad, err := checkFanout(ctx, pool)
		if err != nil {
			return 0, err
		}
		rep.Lost += bad
	}
	return float64(o.Events) / d.Seconds(), nil
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
