package bench

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/statements"
)

// startRelay starts one relay with the benchmark's subscribers on pool.
func startRelay(ctx context.Context, pool *pgxpool.Pool, batch int) (*events.Relay, error) {
	client, err := riverClient(pool)
	if err != nil {
		return nil, err
	}
	r, err := events.NewRelay(pool, &events.RelayConfig{BatchSize: batch, Logger: quiet})
	if err != nil {
		return nil, err
	}
	for _, s := range subscribers() {
		if err := r.Subscribe(s); err != nil {
			return nil, err
		}
	}
	if err := r.Start(ctx, client); err != nil {
		return nil, err
	}
	select {
	case <-r.Ready():
		return r, nil
	case <-time.After(30 * time.Second):
		_ = r.Stop(ctx)
		return nil, fmt.Errorf("the relay never got ready")
	}
}

// roundTrips counts the statements a function sends on conn.
type roundTrips struct{ n atomic.Int64 }

func (c *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func runRecordOverhead(ctx context.Context, h *harness, o Options, rep *Report) error {
	pool, err := h.database(ctx, 4)
	if err != nil {
		return err
	}
	defer h.drop(ctx)
	defer pool.Close()

	hostTx := func(withRecord bool, i int) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "UPDATE bench_accounts SET balance = balance + 1 WHERE id = $1", 1+i%1000); err != nil {
				return err
			}
			if withRecord {
				_, err := events.Record(ctx, tx, events.Event{Type: "account.credited", Subject: fmt.Sprintf("account:%d", 1+i%1000),
					Payload: []byte(`{"amount_cents":100}`)})
				return err
			}
			return nil
		})
	}
	// Warm the pool's connections and the table first; then alternate
	// blocks, so drift in the machine hits both sides alike.
	for i := range 50 {
		if err := hostTx(i%2 == 0, i); err != nil {
			return err
		}
	}
	var without, with time.Duration
	const block = 100
	for done := 0; done < o.HostTxs; done += block {
		for _, withRecord := range []bool{false, true} {
			start := time.Now()
			for i := range min(block, o.HostTxs-done) {
				if err := hostTx(withRecord, done+i); err != nil {
					return err
				}
			}
			if withRecord {
				with += time.Since(start)
			} else {
				without += time.Since(start)
			}
		}
	}
	perTx := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(o.HostTxs) }
	rep.add("record", "host tx (UPDATE one row)", perTx(without), "µs/tx")
	rep.add("record", "host tx + Record", perTx(with), "µs/tx")
	rep.add("record", "host tx + Record ÷ host tx", with.Seconds()/without.Seconds(), "×")

	// Round trips, counted on a traced connection.
	cfg, err := pgx.ParseConfig(pool.Config().ConnString())
	if err != nil {
		return err
	}
	tracer := &roundTrips{}
	cfg.Tracer = tracer
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	count := func(withRecord bool) (int64, error) {
		before := tracer.n.Load()
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "UPDATE bench_accounts SET balance = balance + 1 WHERE id = 1"); err != nil {
				return err
			}
			if withRecord {
				_, err := events.Record(ctx, tx, events.Event{Type: "account.credited"})
				return err
			}
			return nil
		})
		return tracer.n.Load() - before, err
	}
	rtWithout, err := count(false)
	if err != nil {
		return err
	}
	rtWith, err := count(true)
	if err != nil {
		return err
	}
	rep.addTarget("record", "round trips added by Record", float64(rtWith-rtWithout), "round trips", "≤ 1", rtWith-rtWithout <= 1)

	// RecordMany of 2,000 against a plain multi-row insert and COPY of the
	// same rows into the same table.
	const n = 2000
	mk := func() ([]events.Event, []uuid.UUID, []string, []string, []string) {
		es := make([]events.Event, n)
		ids, types, subjects, payloads := make([]uuid.UUID, n), make([]string, n), make([]string, n), make([]string, n)
		for i := range es {
			es[i] = events.Event{Type: "doc.imported", Subject: fmt.Sprintf("doc:%d", i), Payload: []byte(`{"pages":12,"lang":"en"}`)}
			ids[i], types[i], subjects[i], payloads[i] = uuid.Must(uuid.NewV7()), es[i].Type, es[i].Subject, string(es[i].Payload)
		}
		return es, ids, types, subjects, payloads
	}
	reps := max(3, min(15, o.HostTxs/100))
	var tMany, tInsert, tCopy time.Duration
	for range reps {
		es, ids, types, subjects, payloads := mk()
		start := time.Now()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := events.RecordMany(ctx, tx, es); return err }); err != nil {
			return err
		}
		tMany += time.Since(start)

		_, ids, types, subjects, payloads = mk()
		start = time.Now()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO outbox_events (id, type, subject, payload)
				SELECT id, type, subject, payload::jsonb FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) AS u(id, type, subject, payload)`,
				ids, types, subjects, payloads)
			return err
		}); err != nil {
			return err
		}
		tInsert += time.Since(start)

		_, ids, types, subjects, payloads = mk()
		rows := make([][]any, n)
		for i := range rows {
			rows[i] = []any{ids[i], types[i], subjects[i], payloads[i]}
		}
		start = time.Now()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"outbox_events"}, []string{"id", "type", "subject", "payload"}, pgx.CopyFromRows(rows))
			return err
		}); err != nil {
			return err
		}
		tCopy += time.Since(start)
	}
	perBatch := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(reps) }
	rep.add("record", "RecordMany(2000)", perBatch(tMany), "ms")
	rep.add("record", "plain multi-row INSERT (2000)", perBatch(tInsert), "ms")
	rep.add("record", "COPY (2000)", perBatch(tCopy), "ms")
	rep.add("record", "RecordMany ÷ multi-row INSERT", tMany.Seconds()/tInsert.Seconds(), "×")
	rep.add("record", "RecordMany ÷ COPY", tMany.Seconds()/tCopy.Seconds(), "×")
	return nil
}

// fannedListener collects commit-to-fanned latencies from the relays'
// notifications.
type fannedListener struct {
	mu      sync.Mutex
	pending map[string]time.Time
	lat     []time.Duration
	fanned  int // every ID notified, pending or not
}

func (f *fannedListener) committing(id uuid.UUID, at time.Time) {
	f.mu.Lock()
	f.pending[id.String()] = at
	f.mu.Unlock()
}

// count is how many IDs the fanned notifications named so far.
func (f *fannedListener) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fanned
}

func (f *fannedListener) run(ctx context.Context, conn *pgx.Conn) {
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return
		}
		now := time.Now()
		f.mu.Lock()
		for _, id := range strings.Split(n.Payload, ",") {
			f.fanned++
			if at, ok := f.pending[id]; ok {
				f.lat = append(f.lat, now.Sub(at))
				delete(f.pending, id)
			}
		}
		f.mu.Unlock()
	}
}

// listenFanned starts a fannedListener on a connection of its own to
// pool's database; stop ends it and closes the connection.
func listenFanned(ctx context.Context, pool *pgxpool.Pool) (fl *fannedListener, stop func(), err error) {
	conn, err := pgx.Connect(ctx, pool.Config().ConnString())
	if err != nil {
		return nil, nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+statements.ChannelFanned); err != nil {
		conn.Close(context.Background())
		return nil, nil, err
	}
	fl = &fannedListener{pending: map[string]time.Time{}}
	lctx, cancel := context.WithCancel(ctx)
	listening := make(chan struct{})
	go func() { defer close(listening); fl.run(lctx, conn) }()
	return fl, func() {
		cancel()
		<-listening
		conn.Close(context.Background())
	}, nil
}

func runLatency(ctx context.Context, h *harness, o Options, rep *Report) error {
	for _, rate := range o.Rates {
		if err := latencyAt(ctx, h, o, rate, rep); err != nil {
			return err
		}
	}
	return nil
}

func latencyAt(ctx context.Context, h *harness, o Options, rate int, rep *Report) error {
	writers := max(2, rate/100)
	if err := withRelay(ctx, h, o, int32(writers+10), func(pool *pgxpool.Pool) error {
		return measureLatency(ctx, pool, o, rate, writers, rep)
	}); err != nil {
		return err
	}
	if rate > 200 {
		return nil
	}
	// The same with a notification in every transaction: what the throttle
	// costs in latency.
	if err := withRelay(ctx, h, o, int32(writers+10), func(pool *pgxpool.Pool) error {
		return measureLatencySection(ctx, pool, o, rate, writers, rep, "latency", ", notify every tx")
	}); err != nil {
		return err
	}
	// Watched-table writes, which send no notification: what the relays'
	// re-checks and polls give them.
	return withRelay(ctx, h, o, int32(writers+10), func(pool *pgxpool.Pool) error {
		return measureLatencySection(ctx, pool, o, rate, writers, rep, "latency", ", watched table")
	})
}

// withRelay runs f on a fresh database with a relay running on it.
func withRelay(ctx context.Context, h *harness, o Options, conns int32, f func(*pgxpool.Pool) error) error {
	pool, err := h.database(ctx, conns)
	if err != nil {
		return err
	}
	defer h.drop(ctx)
	defer pool.Close()
	relay, err := startRelay(ctx, pool, o.Batch)
	if err != nil {
		return err
	}
	defer relay.Stop(ctx)
	return f(pool)
}

func measureLatency(ctx context.Context, pool *pgxpool.Pool, o Options, rate, writers int, rep *Report) error {
	return measureLatencySection(ctx, pool, o, rate, writers, rep, "latency", "")
}

// outboxFor is how a latency run's writers record: with the default
// notification throttle, or notifying in every transaction (the suffix says).
func outboxFor(suffix string) events.Outbox {
	if strings.Contains(suffix, "every tx") {
		return events.Outbox{NotifyInterval: events.NotifyEveryTransaction}
	}
	return events.Outbox{}
}

// latencyWrite is latency writer's transaction i: a Record (throttled, or
// notifying in every transaction: the suffix says), or an UPDATE of a watched
// table, whose trigger sends no notification. It returns the event's ID.
func latencyWrite(ctx context.Context, tx pgx.Tx, suffix string, i int64) (uuid.UUID, error) {
	if !strings.Contains(suffix, "watched table") {
		e, err := outboxFor(suffix).Record(ctx, tx, events.Event{Type: "order.placed", Subject: fmt.Sprintf("order:%d", i)})
		return e.ID, err
	}
	if _, err := tx.Exec(ctx, "UPDATE bench_watched SET balance = balance + 1 WHERE id = $1", i%1000+1); err != nil {
		return uuid.Nil, err
	}
	recorded, err := events.RecordedInTx(ctx, tx)
	if err != nil {
		return uuid.Nil, err
	}
	if len(recorded) != 1 {
		return uuid.Nil, fmt.Errorf("the watched table's UPDATE recorded %d events", len(recorded))
	}
	return recorded[0].ID, nil
}

// measureLatencySection measures commit→fanned at rate, reporting under
// section with suffix appended to the figures' names.
// steadyWrites runs total writes at rate per second, spread over writers
// goroutines, each write in a transaction of its own on pool (write gets
// the transaction and the write's index). started, if set, learns how many
// writes have begun.
func steadyWrites(ctx context.Context, pool *pgxpool.Pool, writers, rate, total int, started *atomic.Int64,
	write func(tx pgx.Tx, i int64) error) error {
	if started == nil {
		started = new(atomic.Int64)
	}
	start := time.Now()
	var g errgroup.Group
	for range writers {
		g.Go(func() error {
			for {
				i := started.Add(1) - 1
				if i >= int64(total) {
					return nil
				}
				time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))))
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return write(tx, i) }); err != nil {
					return err
				}
			}
		})
	}
	return g.Wait()
}

func measureLatencySection(ctx context.Context, pool *pgxpool.Pool, o Options, rate, writers int, rep *Report, section, suffix string) error {
	fl, stopListening, err := listenFanned(ctx, pool)
	if err != nil {
		return err
	}

	// A steady rate: the first half second (connections dialled, statements
	// prepared, plans cached, on both sides) is sent but not counted.
	warm := rate / 2
	total := warm + int(o.LatencyFor.Seconds()*float64(rate))
	start := time.Now()
	err = steadyWrites(ctx, pool, writers, rate, total, nil, func(tx pgx.Tx, i int64) error {
		id, err := latencyWrite(ctx, tx, suffix, i)
		if err == nil && i >= int64(warm) {
			fl.committing(id, time.Now()) // the commit is next
		}
		return err
	})
	elapsed := time.Since(start)
	if err != nil {
		stopListening()
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		fl.mu.Lock()
		left := len(fl.pending)
		fl.mu.Unlock()
		if left == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopListening()
	fl.mu.Lock()
	defer fl.mu.Unlock()
	rep.Lost += len(fl.pending)
	p50, p95, p99 := percentiles(fl.lat)
	name := fmt.Sprintf("commit→fanned at %d/s%s", rate, suffix)
	rep.add(section, name+" (achieved rate)", float64(total)/elapsed.Seconds(), "events/s")
	switch {
	case rate <= 200 && suffix == "":
		rep.addTarget(section, name+" p50", ms(p50), "ms", "≤ 1.5", ms(p50) <= 1.5)
		rep.add(section, name+" p95", ms(p95), "ms")
		rep.addTarget(section, name+" p99", ms(p99), "ms", "≤ 5", ms(p99) <= 5)
	case rate >= 2000 && suffix == "":
		rep.add(section, name+" p50", ms(p50), "ms")
		rep.add(section, name+" p95", ms(p95), "ms")
		rep.addTarget(section, name+" p99", ms(p99), "ms", "≤ 50", ms(p99) <= 50)
	default:
		rep.add(section, name+" p50", ms(p50), "ms")
		rep.add(section, name+" p95", ms(p95), "ms")
		rep.add(section, name+" p99", ms(p99), "ms")
	}
	fmt.Fprintf(o.Log, "commit→fanned at %d/s%s: p50 %.2fms p95 %.2fms p99 %.2fms over %d events\n", rate, suffix, ms(p50), ms(p95), ms(p99), len(fl.lat))
	return nil
}

func runReceipts(ctx context.Context, h *harness, o Options, rep *Report) error {
	for _, writers := range []int{1, 50} {
		err := withRelay(ctx, h, o, int32(writers+10), func(pool *pgxpool.Pool) error {
			awaiter, err := events.NewAwaiter(pool, &events.AwaiterConfig{Logger: quiet})
			if err != nil {
				return err
			}
			if err := awaiter.Start(ctx); err != nil {
				return err
			}
			defer awaiter.Stop(ctx)
			per := max(1, o.Receipts/writers)
			var (
				mu  sync.Mutex
				lat []time.Duration
				g   errgroup.Group
			)
			for w := range writers {
				g.Go(func() error {
					for i := range per {
						tx, err := pool.Begin(ctx)
						if err != nil {
							return err
						}
						e, err := events.Record(ctx, tx, events.Event{Type: "order.placed", Subject: fmt.Sprintf("order:%d:%d", w, i)})
						if err != nil {
							_ = tx.Rollback(ctx)
							return err
						}
						start := time.Now()
						if err := tx.Commit(ctx); err != nil {
							return err
						}
						got, err := awaiter.AwaitFanout(ctx, e.ID)
						if err != nil {
							return err
						}
						d := time.Since(start)
						if len(got[0].Fanout) != len(subscriberNames) {
							return fmt.Errorf("receipt of %s has fanout %v", e.ID, got[0].Fanout)
						}
						mu.Lock()
						lat = append(lat, d)
						mu.Unlock()
					}
					return nil
				})
			}
			if err := g.Wait(); err != nil {
				return err
			}
			p50, p95, p99 := percentiles(lat)
			name := fmt.Sprintf("commit→receipt, %d writer(s)", writers)
			if writers == 1 {
				rep.addTarget("receipts", name+" p50", ms(p50), "ms", "≤ 2", ms(p50) <= 2)
				rep.add("receipts", name+" p95", ms(p95), "ms")
				rep.addTarget("receipts", name+" p99", ms(p99), "ms", "≤ 5", ms(p99) <= 5)
			} else {
				rep.add("receipts", name+" p50", ms(p50), "ms")
				rep.add("receipts", name+" p95", ms(p95), "ms")
				rep.add("receipts", name+" p99", ms(p99), "ms")
			}
			fmt.Fprintf(o.Log, "%s: p50 %.2fms p95 %.2fms p99 %.2fms over %d receipts\n", name, ms(p50), ms(p95), ms(p99), len(lat))
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// peakHeap drains a backlog of n events with one relay and reports the
// highest live heap seen, sampled every 5 ms, above the heap before.
func peakHeap(ctx context.Context, h *harness, o Options, n int, rep *Report) (uint64, error) {
	pool, err := h.database(ctx, 10)
	if err != nil {
		return 0, err
	}
	defer h.drop(ctx)
	defer pool.Close()
	if err := backlog(ctx, pool, n); err != nil {
		return 0, err
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				if m.HeapAlloc > peak.Load() {
					peak.Store(m.HeapAlloc)
				}
			}
		}
	}()
	_, err = drainWithRelays(ctx, pool, 1, o.Batch)
	close(stop)
	<-sampled
	if err != nil {
		return 0, err
	}
	bad, err := checkFanout(ctx, pool)
	if err != nil {
		return 0, err
	}
	rep.Lost += bad
	if peak.Load() < base {
		return 0, nil
	}
	return peak.Load() - base, nil
}

func runMemory(ctx context.Context, h *harness, o Options, rep *Report) error {
	small := max(o.MemoryEvents/10, 100)
	smallPeak, err := peakHeap(ctx, h, o, small, rep)
	if err != nil {
		return err
	}
	bigPeak, err := peakHeap(ctx, h, o, o.MemoryEvents, rep)
	if err != nil {
		return err
	}
	mib := func(b uint64) float64 { return float64(b) / (1 << 20) }
	rep.add("memory", fmt.Sprintf("peak heap draining %d events", small), mib(smallPeak), "MiB")
	rep.add("memory", fmt.Sprintf("peak heap draining %d events", o.MemoryEvents), mib(bigPeak), "MiB")
	ratio := float64(bigPeak) / float64(max(smallPeak, 1))
	rep.addTarget("memory", fmt.Sprintf("peak heap ratio, %d÷%d-event backlog", o.MemoryEvents, small), ratio, "×", "bounded (≈1, not 10)", ratio < 2)
	fmt.Fprintf(o.Log, "peak heap: %.1f MiB for %d events, %.1f MiB for %d\n", mib(smallPeak), small, mib(bigPeak), o.MemoryEvents)
	return nil
}
