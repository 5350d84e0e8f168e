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

func subscribers() []events.Subscriber { return subscribersOf(subscriberNames) }

// subscribersOf is a Map subscriber per name, each taking every event, the
// one named "search" coalescing.
func subscribersOf(names []string) []events.Subscriber {
	subs := make([]events.Subscriber, len(names))
	for i, name := range names {
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
	return jobParamsOf(subscriberNames, dst, id, subject)
}

// jobParamsOf is jobParams for the subscribers named names.
func jobParamsOf(names []string, dst []river.InsertManyParams, id uuid.UUID, subject string) []river.InsertManyParams {
	for _, s := range names {
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
	s, err := drainWithRelaysRounds(ctx, pool, subscriberNames, relays, batch, 0)
	return s.wall, err
}

// drainWithRelaysRounds is drainWithRelays with the subscribers named names
// and rounds in flight per relay (0: the default).
func drainWithRelaysRounds(ctx context.Context, pool *pgxpool.Pool, names []string, relays, batch, rounds int) (span, error) {
	client, err := riverClient(pool)
	if err != nil {
		return span{}, err
	}
	var rs []*events.Relay
	for range relays {
		r, err := events.NewRelay(pool, &events.RelayConfig{BatchSize: batch, MaxRoundsInFlight: rounds, Logger: quiet})
		if err != nil {
			return span{}, err
		}
		for _, s := range subscribersOf(names) {
			if err := r.Subscribe(s); err != nil {
				return span{}, err
			}
		}
		rs = append(rs, r)
	}
	// The drain is watched through its last event, a look-up by key: the
	// look for any pending event steps over the dead index entries of every
	// event fanned out so far, about a millisecond of the server's CPU each
	// time, taken from the relays. It runs once the last event is out.
	var last int64
	if err := pool.QueryRow(ctx, "SELECT coalesce(max(seq), 0) FROM outbox_events").Scan(&last); err != nil {
		return span{}, err
	}
	start := startSpan()
	for _, r := range rs {
		if err := r.Start(ctx, client); err != nil {
			return span{}, err
		}
	}
	defer func() {
		for _, r := range rs {
			_ = r.Stop(ctx)
		}
	}()
	for {
		var out bool
		err := pool.QueryRow(ctx, "SELECT coalesce(bool_or(fanned_out_at IS NOT NULL OR poisoned_at IS NOT NULL), true) FROM outbox_events WHERE seq = $1", last).Scan(&out)
		if err != nil {
			return span{}, err
		}
		if out {
			more, err := pending(ctx, pool)
			if err != nil {
				return span{}, err
			}
			if !more {
				return start.end(), nil
			}
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
func drainBare(ctx context.Context, pool *pgxpool.Pool, workers, batch int) (span, error) {
	client, err := riverClient(pool)
	if err != nil {
		return span{}, err
	}
	start := startSpan()
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
		return span{}, err
	}
	return start.end(), nil
}

// insertOnly is baseline (a): River's InsertManyTx inserting the same jobs in
// transactions of the same batch size, with no claiming and no stamping.
func insertOnly(ctx context.Context, pool *pgxpool.Pool, names []string, workers, batch int) (span, error) {
	return insertJobsOnly(ctx, pool, names, workers, batch, func(ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, params []river.InsertManyParams) error {
		_, err := client.InsertManyTx(ctx, tx, params)
		return err
	})
}

// copyOnly is baseline (c): insertOnly with River's InsertManyFastTx, which
// inserts by COPY and returns no rows.
func copyOnly(ctx context.Context, pool *pgxpool.Pool, names []string, workers, batch int) (span, error) {
	return insertJobsOnly(ctx, pool, names, workers, batch, func(ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, params []river.InsertManyParams) error {
		_, err := client.InsertManyFastTx(ctx, tx, params)
		return err
	})
}

// insertJobsOnly inserts, with insert, the jobs of the subscribers named
// names for every event in pool, in transactions of batch events, from
// workers goroutines at once.
func insertJobsOnly(ctx context.Context, pool *pgxpool.Pool, names []string, workers, batch int,
	insert func(context.Context, *river.Client[pgx.Tx], pgx.Tx, []river.InsertManyParams) error,
) (span, error) {
	client, err := riverClient(pool)
	if err != nil {
		return span{}, err
	}
	rows, err := pool.Query(ctx, "SELECT seq, id, subject FROM outbox_events ORDER BY seq")
	if err != nil {
		return span{}, err
	}
	all, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimed, error) {
		var c claimed
		return c, row.Scan(&c.seq, &c.id, &c.subject)
	})
	if err != nil {
		return span{}, err
	}
	work := make(chan []claimed, len(all)/batch+1)
	for i := 0; i < len(all); i += batch {
		work <- all[i:min(i+batch, len(all))]
	}
	close(work)
	start := startSpan()
	var g errgroup.Group
	for range workers {
		g.Go(func() error {
			for chunk := range work {
				params := make([]river.InsertManyParams, 0, len(chunk)*len(names))
				for _, c := range chunk {
					params = jobParamsOf(names, params, c.id, c.subject)
				}
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					return insert(ctx, client, tx, params)
				}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return span{}, err
	}
	return start.end(), nil
}

// checkFanout counts events that are not fanned out with exactly one job per
// subscriber, each naming an existing job of that subscriber and event.
func checkFanout(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	return checkFanoutOf(ctx, pool, len(subscriberNames))
}

// checkFanoutOf is checkFanout for subs subscribers.
func checkFanoutOf(ctx context.Context, pool *pgxpool.Pool, subs int) (int, error) {
	var bad int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events e
		WHERE e.fanned_out_at IS NULL
		   OR (SELECT count(*) FROM jsonb_each(e.fanout)) <> $1
		   OR EXISTS (SELECT 1 FROM jsonb_each_text(e.fanout) f
		              WHERE NOT EXISTS (SELECT 1 FROM river_job j WHERE j.id = f.value::bigint
		                                  AND j.args->>'subscriber' = f.key AND j.args->>'subject' = e.subject))`, subs).Scan(&bad)
	if err != nil {
		return 0, err
	}
	var jobs, evs int
	if err := pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM river_job), (SELECT count(*) FROM outbox_events)").Scan(&jobs, &evs); err != nil {
		return 0, err
	}
	if jobs != subs*evs {
		bad += abs(jobs - subs*evs)
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
	type variant struct {
		name   string
		drain  func(ctx context.Context, pool *pgxpool.Pool, names []string, relays, batch int) (span, error)
		verify bool
	}
	relay := func(rounds int) func(context.Context, *pgxpool.Pool, []string, int, int) (span, error) {
		return func(ctx context.Context, pool *pgxpool.Pool, names []string, relays, batch int) (span, error) {
			return drainWithRelaysRounds(ctx, pool, names, relays, batch, rounds)
		}
	}
	bare := func(ctx context.Context, pool *pgxpool.Pool, _ []string, workers, batch int) (span, error) {
		return drainBare(ctx, pool, workers, batch)
	}
	var (
		full = variant{fmt.Sprintf("relay (%d rounds in flight)", events.MaxRoundsInFlightDefault), relay(0), true}
		one  = variant{"relay (1 round in flight)", relay(1), true}
		a    = variant{"(a) River InsertManyTx only", insertOnly, false}
		b    = variant{"(b) bare SKIP LOCKED loop", bare, true}
		c    = variant{"(c) River InsertManyFastTx only", copyOnly, false}
	)
	// Three jobs per event, with one relay and with two; then one job per
	// event, with one relay, against the baselines that insert the same
	// jobs (the bare loop writes three).
	for _, run := range []struct {
		names    []string
		workers  int
		variants []variant
	}{
		{subscriberNames, 1, []variant{full, one, a, b, c}},
		{subscriberNames, 2, []variant{full, one, a, b, c}},
		{subscriberNames[:1], 1, []variant{full, a, c}},
	} {
		// Rates, and CPU time per event in µs: the machine's and this
		// process's (the relay or the baseline's client side).
		rates, cpus, clients := make(map[string][]float64), make(map[string][]float64), make(map[string][]float64)
		for round := range o.throughputRounds() {
			for k := range run.variants {
				// Rotate the order so no variant always runs first.
				v := run.variants[(k+round)%len(run.variants)]
				drain := func(ctx context.Context, pool *pgxpool.Pool, relays, batch int) (span, error) {
					return v.drain(ctx, pool, run.names, relays, batch)
				}
				d, err := drainOnce(ctx, h, o, run.workers, len(run.names), drain, v.verify, rep)
				if err != nil {
					return fmt.Errorf("%s: %w", v.name, err)
				}
				fmt.Fprintf(o.Log, "%-31s %d job(s)/event, %d worker(s): %8.0f events/s  %8.0f jobs/s  CPU/event %5.1f µs (this process %4.1f)\n",
					v.name, len(run.names), run.workers, d.rate, d.rate*float64(len(run.names)), us(d.cpu), us(d.client))
				rates[v.name] = append(rates[v.name], d.rate)
				if d.cpuOK {
					cpus[v.name] = append(cpus[v.name], us(d.cpu))
					clients[v.name] = append(clients[v.name], us(d.client))
				}
			}
		}
		m := func(v variant) float64 { return median(rates[v.name]) }
		sfx := fmt.Sprintf(", %d relay(s)", run.workers)
		if len(run.names) == 1 {
			sfx = ", 1 job per event" + sfx
		}
		rep.add("throughput", "relay events/s"+sfx, m(full), "events/s")
		rep.add("throughput", "relay jobs/s"+sfx, m(full)*float64(len(run.names)), "jobs/s")
		rep.add("throughput", "(a) InsertManyTx events/s"+sfx, m(a), "events/s")
		rep.add("throughput", "(c) InsertManyFastTx events/s"+sfx, m(c), "events/s")
		if run.workers == 1 {
			rep.addTarget("throughput", "relay ÷ (a) InsertManyTx"+sfx, m(full)/m(a), "×", "≥ 1.0", m(full)/m(a) >= 1.0)
		} else {
			rep.add("throughput", "relay ÷ (a) InsertManyTx"+sfx, m(full)/m(a), "×")
		}
		rep.add("throughput", "relay ÷ (c) InsertManyFastTx"+sfx, m(full)/m(c), "×")
		if len(run.variants) == 5 {
			rep.add("throughput", "relay, 1 round in flight, events/s"+sfx, m(one), "events/s")
			rep.add("throughput", "(b) bare loop events/s"+sfx, m(b), "events/s")
			rep.add("throughput", "relay, 1 round ÷ (a) InsertManyTx"+sfx, m(one)/m(a), "×")
			rep.addTarget("throughput", "relay, 1 round ÷ (b) bare loop"+sfx, m(one)/m(b), "×", "≥ 0.9", m(one)/m(b) >= 0.9)
		}
		// What each event cost in CPU: it tells a relay short of a baseline
		// because it does more work per event from one short because it
		// waits, and it moves less from run to run than a ratio of rates.
		if len(cpus[full.name]) > 0 && len(cpus[a.name]) > 0 {
			for _, v := range run.variants {
				rep.add("throughput", "CPU per event, "+v.name+sfx, median(cpus[v.name]), "µs")
			}
			rep.add("throughput", "CPU per event in the relay's process"+sfx, median(clients[full.name]), "µs")
			rep.add("throughput", "CPU per event, (a) ÷ relay"+sfx, median(cpus[a.name])/median(cpus[full.name]), "×")
		}
	}
	return nil
}

// drainOnce loads a backlog into a fresh database and times one drain.
func drainOnce(ctx context.Context, h *harness, o Options, workers, subs int,
	drain func(context.Context, *pgxpool.Pool, int, int) (span, error), verify bool, rep *Report,
) (drained, error) {
	pool, err := h.database(ctx, 20)
	if err != nil {
		return drained{}, err
	}
	defer h.drop(ctx)
	defer pool.Close()
	if err := backlog(ctx, pool, o.Events); err != nil {
		return drained{}, err
	}
	// Start every drain from the same state: statistics fresh, no dirty
	// buffers from loading.
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE outbox_events"); err != nil {
		return drained{}, err
	}
	_, _ = pool.Exec(ctx, "CHECKPOINT") // superuser only; best effort
	d, err := drain(ctx, pool, workers, o.Batch)
	if err != nil {
		return drained{}, err
	}
	if verify {
		bad, err := checkFanoutOf(ctx, pool, subs)
		if err != nil {
			return drained{}, err
		}
		rep.Lost += bad
	}
	n := time.Duration(o.Events)
	return drained{rate: float64(o.Events) / d.wall.Seconds(), cpu: d.machine / n, client: d.self / n, cpuOK: d.cpuOK}, nil
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// drained is one timed drain: its rate, and the CPU time it cost per event,
// on the whole machine and in this process (the client's share).
type drained struct {
	rate        float64
	cpu, client time.Duration
	cpuOK       bool
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
