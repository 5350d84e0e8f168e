package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/standmeet/events"
)

// The held-snapshot section (issue 31): what a transaction that holds an
// old snapshot — an analytics query, pg_dump, a standby with
// hot_standby_feedback, a forgotten BEGIN — costs the relay. VACUUM may not
// remove the row versions that the stamps leave behind while it is held,
// and a claim steps over them. Two runs on fresh databases, the same in all
// but the snapshot: one relay, three subscribers, writers recording at a
// steady rate (SnapshotRate, one event per transaction) for SnapshotFor; in
// the second run a REPEATABLE READ transaction takes its snapshot a fifth of
// the way in and holds it to the end of the run. Each figure of the second
// run is a ratio to the first:
//
//   - commit→fanned p50 and p99 of the events committed in the last fifth
//     (the relay's fanned notification, as in the latency section);
//   - events not yet fanned out when the writers stop;
//   - the drain of a backlog (SnapshotBacklog events recorded while no
//     relay runs, in transactions of 2,000) by a new relay, the snapshot
//     still held;
//   - then as many pairs owed to a subscriber paused meanwhile, delivered
//     when it resumes, the snapshot still held (each delivered pair is
//     deleted);
//   - outbox_events' dead row versions and size at the end.
//
// With SnapshotWriter, the held transaction also takes a transaction ID of
// its own (as one that wrote would), and is the oldest running one while
// it is held.

// snapshotSubscribers are the section's three subscribers, each mapping
// every event to a job of its own.
func snapshotSubscribers() []events.Subscriber {
	var subs []events.Subscriber
	for _, name := range []string{"billing", "search", "audit"} {
		subs = append(subs, events.Subscriber{Name: name, Types: []string{"snap.*"},
			Map: func(_ context.Context, e events.Event) (river.JobArgs, *river.InsertOpts, error) {
				return JobArgs{EventID: e.ID, Subject: e.Subject, Subscriber: name}, nil, nil
			}})
	}
	return subs
}

// startSnapshotRelay starts a relay with the section's subscribers.
func startSnapshotRelay(ctx context.Context, pool *pgxpool.Pool, o Options) (*events.Relay, error) {
	client, err := riverClient(pool)
	if err != nil {
		return nil, err
	}
	r, err := events.NewRelay(pool, &events.RelayConfig{BatchSize: o.Batch, Logger: quiet})
	if err != nil {
		return nil, err
	}
	for _, s := range snapshotSubscribers() {
		if err := r.Subscribe(s); err != nil {
			return nil, err
		}
	}
	return r, r.Start(ctx, client)
}

// snapshotResult is what one run measured.
type snapshotResult struct {
	p50, p99   time.Duration
	unfanned   int
	drain      time.Duration
	owedDrain  time.Duration
	dead, live int64
	bytes      int64
	lost       int
}

// snapshotRun runs the workload once, holding a snapshot if held.
func snapshotRun(ctx context.Context, h *harness, o Options, held bool) (snapshotResult, error) {
	var res snapshotResult
	writers := max(2, o.SnapshotRate/100)
	pool, err := h.database(ctx, int32(writers+20))
	if err != nil {
		return res, err
	}
	defer h.drop(ctx)
	defer pool.Close()
	relay, err := startSnapshotRelay(ctx, pool, o)
	if err != nil {
		return res, err
	}
	defer func() { _ = relay.Stop(ctx) }()
	fl, stopListening, err := listenFanned(ctx, pool)
	if err != nil {
		return res, err
	}
	defer stopListening()

	// The holder: a connection of its own, its snapshot taken a fifth of
	// the way in, released at the end of the run.
	holder, err := pgx.Connect(ctx, pool.Config().ConnString())
	if err != nil {
		return res, err
	}
	defer holder.Close(context.Background())
	var holding pgx.Tx
	defer func() {
		if holding != nil {
			_ = holding.Rollback(context.Background())
		}
	}()

	total := int(o.SnapshotFor.Seconds() * float64(o.SnapshotRate))
	holdAt, countFrom := total/5, total-total/5
	var next atomic.Int64
	errc := make(chan error, 1)
	go func() {
		errc <- steadyWrites(ctx, pool, writers, o.SnapshotRate, total, &next, func(tx pgx.Tx, i int64) error {
			e, err := events.Record(ctx, tx, events.Event{Type: "snap.changed", Subject: fmt.Sprintf("account:%d", i%1000),
				Payload: []byte(`{"balance_cents":1299}`)})
			if err == nil && i >= int64(countFrom) {
				fl.committing(e.ID, time.Now()) // the commit is next
			}
			return err
		})
	}()
	if held {
		for next.Load() < int64(holdAt) {
			select {
			case err := <-errc: // the writers failed (or finished) first
				if err == nil {
					err = fmt.Errorf("the writers finished before the snapshot was taken")
				}
				return res, err
			case <-time.After(10 * time.Millisecond):
			}
		}
		holding, err = holder.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err == nil {
			// The snapshot is taken at the first statement.
			_, err = holding.Exec(ctx, "SELECT count(*) FROM outbox_subscribers")
		}
		if err == nil && o.SnapshotWriter {
			_, err = holding.Exec(ctx, "SELECT pg_current_xact_id()")
		}
		if err != nil {
			<-errc
			return res, err
		}
	}
	if err := <-errc; err != nil {
		return res, err
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE fanned_out_at IS NULL").Scan(&res.unfanned); err != nil {
		return res, err
	}
	_ = waitFor(ctx, 60*time.Second, "fresh events", func() (bool, error) {
		fl.mu.Lock()
		defer fl.mu.Unlock()
		return len(fl.pending) == 0, nil
	})
	fl.mu.Lock()
	res.p50, _, res.p99 = percentiles(fl.lat)
	res.lost = len(fl.pending)
	fl.mu.Unlock()

	// The backlog, recorded while no relay runs, drained by a new one.
	if err := relay.Stop(ctx); err != nil {
		return res, err
	}
	if err := recordTurns(ctx, pool, "snap.changed", o.SnapshotBacklog, 1000); err != nil {
		return res, err
	}
	fannedBefore := fl.count()
	began := time.Now()
	drainer, err := startSnapshotRelay(ctx, pool, o)
	if err != nil {
		return res, err
	}
	defer func() { _ = drainer.Stop(ctx) }()
	// Counted from the fanned notifications, then checked once in the
	// table: a look for pending rows every few milliseconds would step over
	// the dead entries the held snapshot keeps, and take a core from the
	// relay it measures.
	fannedOut := func(what string, before int) error {
		return waitFor(ctx, 10*time.Minute, what, func() (bool, error) {
			if fl.count() < before+o.SnapshotBacklog {
				return false, nil
			}
			any, err := pending(ctx, pool)
			return !any, err
		})
	}
	if err := fannedOut("draining the backlog", fannedBefore); err != nil {
		return res, err
	}
	res.drain = time.Since(began)

	// Then as many pairs owed to a paused subscriber, delivered when it
	// resumes: each delivered pair is deleted, and under the held snapshot
	// its claim-index entry stays.
	if err := outbox.PauseSubscriber(ctx, pool, "audit"); err != nil {
		return res, err
	}
	fannedBefore = fl.count()
	if err := recordTurns(ctx, pool, "snap.changed", o.SnapshotBacklog, 1000); err != nil {
		return res, err
	}
	if err := fannedOut("fanning the owed backlog out", fannedBefore); err != nil {
		return res, err
	}
	began = time.Now()
	if err := outbox.ResumeSubscriber(ctx, pool, "audit"); err != nil {
		return res, err
	}
	// Looked at every 20 ms: each look reads the deliveries' heap, dead
	// rows and all.
	for owed := true; owed; {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM outbox_deliveries WHERE subscriber = 'audit')").Scan(&owed); err != nil {
			return res, err
		}
		if time.Since(began) > 10*time.Minute {
			return res, fmt.Errorf("draining the owed pairs: not within 10 minutes")
		}
	}
	res.owedDrain = time.Since(began)

	// What the table holds, the snapshot still held: the backends that
	// wrote it flush their statistics as they exit.
	_ = drainer.Stop(ctx)
	stopListening()
	pool.Close()
	name := pool.Config().ConnConfig.Database
	if err := waitFor(ctx, 30*time.Second, "the run's backends to exit", func() (bool, error) {
		var others int
		err := h.admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> $2",
			name, holder.PgConn().PID()).Scan(&others)
		return others == 0, err
	}); err != nil {
		return res, err
	}
	stats, err := pgx.Connect(ctx, pool.Config().ConnString())
	if err != nil {
		return res, err
	}
	defer stats.Close(context.Background())
	err = stats.QueryRow(ctx, `SELECT sum(n_dead_tup)::bigint, sum(n_live_tup)::bigint, sum(pg_total_relation_size(relid))::bigint
		FROM pg_stat_user_tables WHERE relname ~ '^outbox_events_(\d+|legacy)$'`).Scan(&res.dead, &res.live, &res.bytes)
	return res, err
}

func runSnapshot(ctx context.Context, h *harness, o Options, rep *Report) error {
	var runs [2]snapshotResult
	for i, held := range []bool{false, true} {
		r, err := snapshotRun(ctx, h, o, held)
		if err != nil {
			return err
		}
		runs[i] = r
		rep.Lost += r.lost
		fmt.Fprintf(o.Log, "snapshot held=%v: last fifth commit→fanned p50 %.2fms p99 %.2fms; %d unfanned at the end; backlog of %d drained in %v; outbox_events %d dead, %d live, %d MiB\n",
			held, ms(r.p50), ms(r.p99), r.unfanned, o.SnapshotBacklog, r.drain.Round(time.Millisecond), r.dead, r.live, r.bytes>>20)
	}
	const section = "snapshot"
	name := func(s string) string {
		return fmt.Sprintf("%s, %d/s for %v", s, o.SnapshotRate, o.SnapshotFor)
	}
	held := "snapshot held"
	if o.SnapshotWriter {
		held = "writer held"
	}
	for i, label := range []string{"no snapshot", held} {
		rep.add(section, name("last-fifth commit→fanned p50, "+label), ms(runs[i].p50), "ms")
		rep.add(section, name("last-fifth commit→fanned p99, "+label), ms(runs[i].p99), "ms")
		rep.add(section, name("events not fanned out when the writers stopped, "+label), float64(runs[i].unfanned), "")
		rep.add(section, fmt.Sprintf("drain of %d events afterwards, %s", o.SnapshotBacklog, label), runs[i].drain.Seconds(), "s")
		rep.add(section, fmt.Sprintf("drain of %d owed pairs after that, %s", o.SnapshotBacklog, label), runs[i].owedDrain.Seconds(), "s")
		rep.add(section, "outbox_events dead row versions at the end, "+label, float64(runs[i].dead), "")
		rep.add(section, "outbox_events size at the end, "+label, float64(runs[i].bytes)/(1<<20), "MiB")
	}
	ratio := func(held, none time.Duration) float64 { return held.Seconds() / max(none.Seconds(), 1e-6) }
	r50, r99, rd := ratio(runs[1].p50, runs[0].p50), ratio(runs[1].p99, runs[0].p99), ratio(runs[1].drain, runs[0].drain)
	rep.addTarget(section, "commit→fanned p50, "+held+" ÷ none", r50, "×", "≤ 1.5", r50 <= 1.5)
	rep.addTarget(section, "commit→fanned p99, "+held+" ÷ none", r99, "×", "≤ 1.5", r99 <= 1.5)
	rep.addTarget(section, "backlog drain, "+held+" ÷ none", rd, "×", "≤ 1.2", rd <= 1.2)
	ro := ratio(runs[1].owedDrain, runs[0].owedDrain)
	rep.addTarget(section, "owed pairs' drain, "+held+" ÷ none", ro, "×", "≤ 1.2", ro <= 1.2)
	return nil
}
