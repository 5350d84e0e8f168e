package bench

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/standmeet/events"
)

// runOperations measures what running for months costs: fan-out with every
// event carrying a trace context against none, the retention pass's
// deletes/s on a large table while a relay keeps fanning out, and Stats on
// that table.
func runOperations(ctx context.Context, h *harness, o Options, rep *Report) error {
	if err := tracedThroughput(ctx, h, o, rep); err != nil {
		return err
	}
	return retentionUnderLoad(ctx, h, o, rep)
}

// aTraceContext is what Record stores for a request with a span.
const aTraceContext = `{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`

func tracedThroughput(ctx context.Context, h *harness, o Options, rep *Report) error {
	var plain, traced []float64
	for round := range o.throughputRounds() {
		for k := range 2 {
			withTrace := (k+round)%2 == 1
			pool, err := h.database(ctx, 20)
			if err != nil {
				return err
			}
			err = func() error {
				defer h.drop(ctx)
				defer pool.Close()
				if err := backlog(ctx, pool, o.Events); err != nil {
					return err
				}
				if withTrace {
					if _, err := pool.Exec(ctx, "UPDATE outbox_events SET trace_context = $1::jsonb", aTraceContext); err != nil {
						return err
					}
				}
				if _, err := pool.Exec(ctx, "VACUUM ANALYZE outbox_events"); err != nil {
					return err
				}
				d, err := drainWithRelays(ctx, pool, 1, o.Batch)
				if err != nil {
					return err
				}
				bad, err := checkFanout(ctx, pool)
				if err != nil {
					return err
				}
				rep.Lost += bad
				rate := float64(o.Events) / d.Seconds()
				fmt.Fprintf(o.Log, "relay, trace context on every event %-5v %8.0f events/s\n", withTrace, rate)
				if withTrace {
					traced = append(traced, rate)
				} else {
					plain = append(plain, rate)
				}
				return nil
			}()
			if err != nil {
				return err
			}
		}
	}
	rep.add("operations", "relay events/s, no trace context", median(plain), "events/s")
	rep.add("operations", "relay events/s, every event traced", median(traced), "events/s")
	rep.add("operations", "traced ÷ untraced fan-out", median(traced)/median(plain), "×")
	return nil
}

// retentionUnderLoad prunes o.RetentionRows fanned-out rows two ways, each
// on a fresh database while a relay fans out 500 events/s and a writer
// takes write receipts: rows in the partition that is being written (which
// retention may not empty: today's batched DELETE, as before partitions)
// and rows in a partition of an earlier period (emptied with one TRUNCATE).
// It reports both times, their ratio, and the receipts' p99 while each
// pass ran against the p99 of the o.RetentionWindow after it. Stats is measured
// on the first table.
func retentionUnderLoad(ctx context.Context, h *harness, o Options, rep *Report) error {
	var res [2]pruneRun
	for k, truncate := range []bool{false, true} {
		var err error
		if res[k], err = pruneUnderLoad(ctx, h, o, rep, truncate, k == 0); err != nil {
			return err
		}
	}
	rows := o.RetentionRows
	del, trunc := res[0], res[1]
	rep.add("operations", fmt.Sprintf("retention of %d rows by batched DELETE (the partition being written)", rows), del.took.Seconds(), "s")
	rep.add("operations", "retention deletes/s while fanning out 500 events/s", float64(rows)/del.took.Seconds(), "deletes/s")
	rep.add("operations", fmt.Sprintf("retention of %d rows by TRUNCATE of their partition", rows), trunc.took.Seconds(), "s")
	ratio := del.took.Seconds() / trunc.took.Seconds()
	rep.addTarget("operations", "retention: batched DELETE time ÷ TRUNCATE time", ratio, "×", "≥ 10", ratio >= 10)
	for k, r := range res {
		how := []string{"DELETE", "TRUNCATE"}[k]
		_, _, during := percentiles(r.during)
		_, _, after := percentiles(r.after)
		rep.add("operations", fmt.Sprintf("commit→receipt p99 while retention ran (%s)", how), ms(during), "ms")
		rep.add("operations", fmt.Sprintf("commit→receipt p99 in the %v after (%s)", o.RetentionWindow, how), ms(after), "ms")
		q := ms(during) / ms(after)
		if k == 1 {
			rep.addTarget("operations", "receipts' p99 while TRUNCATE ran ÷ after", q, "×", "≤ 1.5", q <= 1.5)
		} else {
			rep.add("operations", "receipts' p99 while DELETE ran ÷ after", q, "×")
		}
		fmt.Fprintf(o.Log, "retention by %s: %d rows in %v; receipts p99 %.2fms during (%d), %.2fms after (%d)\n",
			how, rows, r.took, ms(during), len(r.during), ms(after), len(r.after))
	}
	return nil
}

// pruneRun is one of retentionUnderLoad's: how long the rows took to go,
// and the receipts' latencies meanwhile and after.
type pruneRun struct {
	took          time.Duration
	during, after []time.Duration
}

// pruneUnderLoad runs one of retentionUnderLoad's two: the time from the
// first retention pass (o.RetentionWindow after the relay starts) until
// the rows are gone; the receipts taken meanwhile (and for at least
// o.RetentionWindow, so that a pass of milliseconds has samples around
// it), then those of the o.RetentionWindow after.
func pruneUnderLoad(ctx context.Context, h *harness, o Options, rep *Report, truncate, stats bool) (pruneRun, error) {
	var run pruneRun
	rows := o.RetentionRows
	pool, err := h.database(ctx, 20)
	if err != nil {
		return run, err
	}
	defer h.drop(ctx)
	defer pool.Close()
	slot := "outbox_slot_of(now())" // the partition being written: not emptied
	if truncate {
		slot = "(outbox_slot_of(now()) + 5) % 10"
	}
	if _, err := pool.Exec(ctx, `INSERT INTO outbox_events (id, type, fanned_out_at, fanout, created_at, slot)
		SELECT gen_random_uuid(), 'old', now() - interval '2 days' - g * interval '1 millisecond', '{}', now() - interval '2 days', `+slot+`
		  FROM generate_series(1, $1::int) g`, rows); err != nil {
		return run, err
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE outbox_events"); err != nil {
		return run, err
	}
	if stats {
		var took []time.Duration
		for range 10 {
			start := time.Now()
			if _, err := outbox.GetStats(ctx, pool); err != nil {
				return run, err
			}
			took = append(took, time.Since(start))
		}
		sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
		rep.add("operations", fmt.Sprintf("Stats on a %d-row table (median of 10)", rows), ms(took[len(took)/2]), "ms")
	}

	// A relay with a one-day retention, while writers record 500 events/s
	// and one takes receipts.
	client, err := riverClient(pool)
	if err != nil {
		return run, err
	}
	relay, err := events.NewRelay(pool, &events.RelayConfig{BatchSize: o.Batch, Logger: quiet, Retention: 24 * time.Hour,
		RetentionInterval: 10 * o.RetentionWindow}) // the first pass a window after Start
	if err != nil {
		return run, err
	}
	for _, s := range subscribers() {
		if err := relay.Subscribe(s); err != nil {
			return run, err
		}
	}
	awaiter, err := events.NewAwaiter(pool, &events.AwaiterConfig{Logger: quiet})
	if err != nil {
		return run, err
	}
	if err := awaiter.Start(ctx); err != nil {
		return run, err
	}
	defer awaiter.Stop(ctx)
	stopWriting := make(chan struct{})
	writing := make(chan error, 1)
	go func() { writing <- writeSteadily(ctx, pool, 500, stopWriting) }()
	var (
		mu       sync.Mutex
		receipts []time.Time // commit time of each, with its latency
		lat      []time.Duration
	)
	receipting := make(chan error, 1)
	go func() {
		receipting <- takeReceipts(ctx, pool, awaiter, stopWriting, func(at time.Time, d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			receipts, lat = append(receipts, at), append(lat, d)
		})
	}()
	stop := func() error {
		close(stopWriting)
		return errors.Join(<-writing, <-receipting)
	}
	start := time.Now()
	if err := relay.Start(ctx, client); err != nil {
		return run, errors.Join(err, stop())
	}
	defer relay.Stop(ctx)
	for {
		var left bool
		if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM outbox_events WHERE type = 'old')").Scan(&left); err != nil {
			return run, errors.Join(err, stop())
		}
		if !left {
			break
		}
		if time.Since(start) > 10*time.Minute {
			return run, errors.Join(fmt.Errorf("retention left rows after 10 minutes"), stop())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The first pass starts a window after Start (a tenth of the
	// interval): the window before it lets the relay settle (the writers
	// started first), and its receipts are not counted.
	passed := start.Add(o.RetentionWindow)
	run.took = time.Since(passed)
	pruned := passed.Add(max(run.took, o.RetentionWindow))
	// A window after the pass, and at least one receipt committed in it:
	// on a loaded machine a receipt can take longer than a short window
	// (the smoke test's), and the writer awaits each before the next.
	afterEnd := pruned.Add(o.RetentionWindow)
	time.Sleep(time.Until(afterEnd))
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		mu.Lock()
		got := len(receipts) > 0 && !receipts[len(receipts)-1].Before(pruned)
		mu.Unlock()
		if got {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	afterEnd = time.Now()
	if err := stop(); err != nil {
		return run, err
	}
	mu.Lock()
	defer mu.Unlock()
	for i, at := range receipts {
		switch {
		case !at.Add(lat[i]).After(passed):
			// Received before the pass began.
		case at.Before(pruned):
			// Waited while the pass ran: committed during it, or before
			// and received during it (a slow receipt can outlast a short
			// window, leaving no commit inside it).
			run.during = append(run.during, lat[i])
		case at.Before(afterEnd):
			run.after = append(run.after, lat[i])
		}
	}
	if len(run.during) == 0 || len(run.after) == 0 {
		return run, fmt.Errorf("retention: no receipts during (%d) or after (%d)", len(run.during), len(run.after))
	}
	return run, nil
}

// takeReceipts records one event at a time, 100 a second, commits it and
// waits for its receipt, until stop; took gets each commit's time and its
// commit→receipt latency.
func takeReceipts(ctx context.Context, pool *pgxpool.Pool, awaiter *events.Awaiter, stop <-chan struct{}, took func(time.Time, time.Duration)) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return nil
		case <-t.C:
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		e, err := events.Record(ctx, tx, events.Event{Type: "order.placed", Subject: fmt.Sprintf("receipt:%d", i)})
		if err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		start := time.Now()
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		if _, err := awaiter.AwaitFanout(ctx, e.ID); err != nil {
			return err
		}
		took(start, time.Since(start))
	}
}

// writeSteadily records rate events/s, one per transaction, until stop.
func writeSteadily(ctx context.Context, pool *pgxpool.Pool, rate int, stop <-chan struct{}) error {
	t := time.NewTicker(time.Second / time.Duration(rate))
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return nil
		case <-t.C:
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := events.Record(ctx, tx, events.Event{Type: "order.placed", Subject: fmt.Sprintf("order:%d", i)})
			return err
		}); err != nil {
			return err
		}
	}
}
