package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/standmeet/events"
)

// The ordered section: one Handle subscriber, Ordered or not, on the same
// workload, each figure a ratio to the unordered run of the same size in the
// same run. Subjects take turns (event i has subject i mod subjects), so
// with 100 subjects every relay batch holds several events of each subject
// (their jobs wait behind one another), and with one (a hot subject) every
// job waits behind the one before it.
//
//   - fan-out: one relay drains the backlog into River (an insert-only
//     client): what placing the jobs in their chains costs the relay;
//   - handled: the relay and a River client (50 workers, 1 ms fetch
//     cooldown) drain it until every job is completed: what running one
//     subject at a time costs end to end;
//   - round trips and rows written per event during "handled": every query,
//     batch and copy the pool sent (River's own included), and the rows
//     inserted, updated and deleted in every table, read from
//     pg_stat_user_tables once the pool's connections have closed;
//   - latency: events recorded at a steady rate over 100 subjects, from the
//     commit to the handler's start.

// orderedSizes are the subject counts of the section.
var orderedSizes = []int{100, 1}

// countingTracer counts round trips: queries, batches and copies.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *countingTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *countingTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *countingTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (c *countingTracer) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *countingTracer) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}

// orderedBacklog records n events over subjects subjects, taking turns.
func orderedBacklog(ctx context.Context, pool *pgxpool.Pool, n, subjects int) error {
	return recordTurns(ctx, pool, "account.changed", n, subjects)
}

// recordTurns records n events of type typ over subjects subjects, taking
// turns, in transactions of 2,000.
func recordTurns(ctx context.Context, pool *pgxpool.Pool, typ string, n, subjects int) error {
	for done := 0; done < n; {
		size := min(2000, n-done)
		es := make([]events.Event, size)
		for i := range es {
			es[i] = events.Event{Type: typ, Subject: fmt.Sprintf("account:%d", (done+i)%subjects),
				Payload: []byte(`{"balance_cents":1299}`)}
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

// orderedRun is one measured variant.
type orderedRun struct {
	ordered  bool
	subjects int
	n        int
	batch    int
	// riverDefaults runs River's fetch at its defaults (FetchCooldown
	// 100 ms, FetchPollInterval 1 s) instead of a 1 ms cooldown.
	riverDefaults bool
}

// handledCounter is the subscriber's handler: it counts and, for the
// latency run, takes each event's start time.
type handledCounter struct {
	n       atomic.Int64
	mu      sync.Mutex
	started map[uuid.UUID]time.Time
}

func (h *handledCounter) subscriber(ordered bool) events.Subscriber {
	return events.Subscriber{Name: "projector", Types: []string{"**"}, Ordered: ordered,
		Handle: func(_ context.Context, e events.Event) error {
			if h.started != nil {
				h.mu.Lock()
				h.started[e.ID] = time.Now()
				h.mu.Unlock()
			}
			h.n.Add(1)
			return nil
		}}
}

// workingClient is a River client that works the relay's handler jobs:
// with a 1 ms fetch cooldown, or River's defaults (riverDefaults).
func workingClient(pool *pgxpool.Pool, relay *events.Relay, riverDefaults bool) (*river.Client[pgx.Tx], error) {
	workers := river.NewWorkers()
	if err := relay.AddWorkers(workers); err != nil {
		return nil, err
	}
	cfg := &river.Config{Logger: quiet, Workers: workers,
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 50}},
		FetchCooldown: time.Millisecond, FetchPollInterval: 100 * time.Millisecond,
		Middleware: []rivertype.Middleware{&events.OrderedMiddleware{}}}
	if riverDefaults {
		cfg.FetchCooldown, cfg.FetchPollInterval = 0, 0
	}
	return river.NewClient(riverpgxv5.New(pool), cfg)
}

// fanout times one relay draining the backlog with an insert-only client.
func (o orderedRun) fanout(ctx context.Context, h *harness) (time.Duration, error) {
	pool, err := h.database(ctx, 20)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	if err := orderedBacklog(ctx, pool, o.n, o.subjects); err != nil {
		return 0, err
	}
	client, err := riverClient(pool)
	if err != nil {
		return 0, err
	}
	relay, err := events.NewRelay(pool, &events.RelayConfig{BatchSize: o.batch, Logger: quiet})
	if err != nil {
		return 0, err
	}
	var hc handledCounter
	if err := relay.Subscribe(hc.subscriber(o.ordered)); err != nil {
		return 0, err
	}
	start := time.Now()
	if err := relay.Start(ctx, client); err != nil {
		return 0, err
	}
	defer relay.Stop(ctx)
	for {
		left, err := pending(ctx, pool)
		if err != nil {
			return 0, err
		}
		if !left {
			return time.Since(start), nil
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// handledResult is what a handled run measured.
type handledResult struct {
	took       time.Duration
	roundTrips float64 // per event
	rows       float64 // per event
}

// handled times a relay and a working client draining the backlog until
// every job is completed, counting round trips and rows written.
func (o orderedRun) handled(ctx context.Context, h *harness) (handledResult, error) {
	var res handledResult
	pool, err := h.database(ctx, 60)
	if err != nil {
		return res, err
	}
	name := pool.Config().ConnConfig.Database
	if err := orderedBacklog(ctx, pool, o.n, o.subjects); err != nil {
		pool.Close()
		return res, err
	}
	rowsBefore, err := rowsWritten(ctx, pool)
	if err != nil {
		pool.Close()
		return res, err
	}
	pool.Close()
	cfg, err := pgxpool.ParseConfig(pool.Config().ConnString())
	if err != nil {
		return res, err
	}
	cfg.MaxConns = 60
	tracer := &countingTracer{}
	cfg.ConnConfig.Tracer = tracer
	pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return res, err
	}
	relay, err := events.NewRelay(pool, &events.RelayConfig{BatchSize: o.batch, Logger: quiet})
	if err != nil {
		pool.Close()
		return res, err
	}
	var hc handledCounter
	if err := relay.Subscribe(hc.subscriber(o.ordered)); err != nil {
		pool.Close()
		return res, err
	}
	client, err := workingClient(pool, relay, o.riverDefaults)
	if err != nil {
		pool.Close()
		return res, err
	}
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		pool.Close()
		return res, err
	}
	if err := relay.Start(ctx, client); err != nil {
		pool.Close()
		return res, err
	}
	for {
		if hc.n.Load() >= int64(o.n) {
			var unfinished bool
			if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM river_job WHERE state <> 'completed')").Scan(&unfinished); err != nil {
				return res, err
			}
			if !unfinished {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	res.took = time.Since(start)
	trips := tracer.n.Load()
	_ = relay.Stop(ctx)
	_ = client.Stop(ctx)
	pool.Close() // the backends flush their table statistics as they exit
	after, err := pgxpool.New(ctx, pool.Config().ConnString())
	if err != nil {
		return res, err
	}
	defer after.Close()
	for range 50 { // the last backends may still be exiting
		var others int
		if err := after.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", name).Scan(&others); err != nil {
			return res, err
		}
		if others == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	rowsAfter, err := rowsWritten(ctx, after)
	if err != nil {
		return res, err
	}
	res.roundTrips = float64(trips) / float64(o.n)
	res.rows = float64(rowsAfter-rowsBefore) / float64(o.n)
	return res, nil
}

// rowsWritten sums the rows inserted, updated and deleted in every table of
// the database.
func rowsWritten(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint FROM pg_stat_user_tables").Scan(&n)
	return n, err
}

// latency records events at rate per second over 100 subjects for d and
// returns the commit-to-handler-start p50 and p99.
func orderedLatency(ctx context.Context, h *harness, ordered bool, rate int, d time.Duration, batch int) (p50, p99 time.Duration, err error) {
	pool, err := h.database(ctx, 60)
	if err != nil {
		return 0, 0, err
	}
	defer pool.Close()
	relay, err := events.NewRelay(pool, &events.RelayConfig{BatchSize: batch, Logger: quiet})
	if err != nil {
		return 0, 0, err
	}
	hc := handledCounter{started: map[uuid.UUID]time.Time{}}
	if err := relay.Subscribe(hc.subscriber(ordered)); err != nil {
		return 0, 0, err
	}
	client, err := workingClient(pool, relay, false)
	if err != nil {
		return 0, 0, err
	}
	if err := client.Start(ctx); err != nil {
		return 0, 0, err
	}
	defer client.Stop(ctx)
	if err := relay.Start(ctx, client); err != nil {
		return 0, 0, err
	}
	defer relay.Stop(ctx)
	<-relay.Ready()
	committed := map[uuid.UUID]time.Time{}
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	end := time.Now().Add(d)
	warm := time.Now().Add(d / 5) // not measured: the first fifth
	for i := 0; time.Now().Before(end); i++ {
		<-tick.C
		var e events.Event
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			e, err = events.Record(ctx, tx, events.Event{Type: "account.changed", Subject: fmt.Sprintf("account:%d", i%100)})
			return err
		}); err != nil {
			return 0, 0, err
		}
		if time.Now().After(warm) {
			committed[e.ID] = time.Now()
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	var lat []time.Duration
	for {
		hc.mu.Lock()
		lat = lat[:0]
		for id, c := range committed {
			if s, ok := hc.started[id]; ok {
				lat = append(lat, s.Sub(c))
			}
		}
		hc.mu.Unlock()
		if len(lat) == len(committed) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(lat) < len(committed) {
		return 0, 0, fmt.Errorf("%d of %d events never handled", len(committed)-len(lat), len(committed))
	}
	p50, _, p99 = percentiles(lat)
	return p50, p99, nil
}

func runOrdered(ctx context.Context, h *harness, opts Options, rep *Report) error {
	n := opts.OrderedEvents
	for _, subjects := range orderedSizes {
		if subjects > n {
			continue
		}
		var fan, done [2]time.Duration
		var cost [2]handledResult
		for i, ordered := range []bool{false, true} {
			o := orderedRun{ordered: ordered, subjects: subjects, n: n, batch: opts.Batch}
			d, err := o.fanout(ctx, h)
			if err != nil {
				return err
			}
			fan[i] = d
			r, err := o.handled(ctx, h)
			if err != nil {
				return err
			}
			done[i], cost[i] = r.took, r
			fmt.Fprintf(opts.Log, "ordered=%v subjects=%d: fan-out %v, handled %v, %.2f round trips and %.2f rows per event\n",
				ordered, subjects, d.Round(time.Millisecond), r.took.Round(time.Millisecond), r.roundTrips, r.rows)
			h.drop(ctx)
		}
		perSec := func(d time.Duration) float64 { return float64(n) / d.Seconds() }
		name := func(s string) string {
			if subjects == 1 {
				return s + ", one hot subject"
			}
			return fmt.Sprintf("%s, %d subjects", s, subjects)
		}
		rep.add("ordered", name("fan-out, unordered"), perSec(fan[0]), "events/s")
		rep.add("ordered", name("fan-out, ordered"), perSec(fan[1]), "events/s")
		rep.add("ordered", name("fan-out, ordered ÷ unordered"), perSec(fan[1])/perSec(fan[0]), "×")
		rep.add("ordered", name("handled, unordered"), perSec(done[0]), "events/s")
		rep.add("ordered", name("handled, ordered"), perSec(done[1]), "events/s")
		ratio := perSec(done[1]) / perSec(done[0])
		rep.addTarget("ordered", name("handled, ordered ÷ unordered"), ratio, "×", "≥ 0.5", ratio >= 0.5)
		rep.add("ordered", name("round trips per event, unordered"), cost[0].roundTrips, "")
		rep.add("ordered", name("round trips per event, ordered"), cost[1].roundTrips, "")
		rep.add("ordered", name("rows written per event, unordered"), cost[0].rows, "")
		rep.add("ordered", name("rows written per event, ordered"), cost[1].rows, "")
	}
	// River's default fetch, 100 subjects: handled only.
	if subjects := orderedSizes[0]; subjects <= n {
		var done [2]time.Duration
		for i, ordered := range []bool{false, true} {
			o := orderedRun{ordered: ordered, subjects: subjects, n: n, batch: opts.Batch, riverDefaults: true}
			r, err := o.handled(ctx, h)
			if err != nil {
				return err
			}
			done[i] = r.took
			fmt.Fprintf(opts.Log, "ordered=%v subjects=%d, River's default fetch: handled %v\n", ordered, subjects, r.took.Round(time.Millisecond))
			h.drop(ctx)
		}
		perSec := func(d time.Duration) float64 { return float64(n) / d.Seconds() }
		name := func(s string) string { return fmt.Sprintf("%s, %d subjects, River's default fetch", s, subjects) }
		rep.add("ordered", name("handled, unordered"), perSec(done[0]), "events/s")
		rep.add("ordered", name("handled, ordered"), perSec(done[1]), "events/s")
		rep.add("ordered", name("handled, ordered ÷ unordered"), perSec(done[1])/perSec(done[0]), "×")
	}
	rate := opts.Rates[0]
	var p50s, p99s [2]time.Duration
	for i, ordered := range []bool{false, true} {
		p50, p99, err := orderedLatency(ctx, h, ordered, rate, opts.LatencyFor, opts.Batch)
		if err != nil {
			return err
		}
		p50s[i], p99s[i] = p50, p99
		h.drop(ctx)
	}
	name := func(s string) string { return fmt.Sprintf("commit to handled %s at %d/s, 100 subjects", s, rate) }
	rep.add("ordered", name("p50, unordered"), ms(p50s[0]), "ms")
	rep.add("ordered", name("p50, ordered"), ms(p50s[1]), "ms")
	rep.add("ordered", name("p99, unordered"), ms(p99s[0]), "ms")
	rep.add("ordered", name("p99, ordered"), ms(p99s[1]), "ms")
	rep.add("ordered", name("p50 added by ordering"), ms(p50s[1]-p50s[0]), "ms")
	return nil
}
