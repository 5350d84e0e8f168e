package bench

import (
	"context"
	"fmt"
	"sort"
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

func retentionUnderLoad(ctx context.Context, h *harness, o Options, rep *Report) error {
	rows := o.RetentionRows
	pool, err := h.database(ctx, 20)
	if err != nil {
		return err
	}
	defer h.drop(ctx)
	defer pool.Close()
	if _, err := pool.Exec(ctx, `INSERT INTO outbox_events (id, type, fanned_out_at, fanout, created_at)
		SELECT gen_random_uuid(), 'old', now() - interval '2 days' - g * interval '1 millisecond', '{}', now() - interval '2 days'
		  FROM generate_series(1, $1::int) g`, rows); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE outbox_events"); err != nil {
		return err
	}
	// Stats on the big table.
	var took []time.Duration
	for range 10 {
		start := time.Now()
		if _, err := outbox.GetStats(ctx, pool); err != nil {
			return err
		}
		took = append(took, time.Since(start))
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	rep.add("operations", fmt.Sprintf("Stats on a %d-row table (median of 10)", rows), ms(took[len(took)/2]), "ms")

	// A relay with a one-day retention, while writers record 500 events/s.
	client, err := riverClient(pool)
	if err != nil {
		return err
	}
	relay, err := events.NewRelay(pool, &events.RelayConfig{BatchSize: o.Batch, Logger: quiet, Retention: 24 * time.Hour,
		RetentionInterval: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	for _, s := range subscribers() {
		if err := relay.Subscribe(s); err != nil {
			return err
		}
	}
	stopWriting := make(chan struct{})
	writing := make(chan error, 1)
	go func() { writing <- writeSteadily(ctx, pool, 500, stopWriting) }()
	start := time.Now()
	if err := relay.Start(ctx, client); err != nil {
		close(stopWriting)
		return err
	}
	defer relay.Stop(ctx)
	for {
		var left int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE type = 'old'").Scan(&left); err != nil {
			close(stopWriting)
			return err
		}
		if left == 0 {
			break
		}
		if time.Since(start) > 10*time.Minute {
			close(stopWriting)
			return fmt.Errorf("retention left %d rows after 10 minutes", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
	elapsed := time.Since(start)
	close(stopWriting)
	if err := <-writing; err != nil {
		return err
	}
	st, err := outbox.GetStats(ctx, pool)
	if err != nil {
		return err
	}
	rate := float64(rows) / elapsed.Seconds()
	fmt.Fprintf(o.Log, "retention: %d rows in %v (%.0f deletes/s) while writing 500 events/s; lag at the end %v\n", rows, elapsed, rate, st.Lag)
	rep.add("operations", "retention deletes/s while fanning out 500 events/s", rate, "deletes/s")
	return nil
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
