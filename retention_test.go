package events

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/maintenance"
	"github.com/standmeet/events/internal/testdb"
)

// insertAged inserts n events fanned out age ago (or in the given state) by
// plain SQL, and returns their IDs.
func insertAged(t *testing.T, b *testBundle, n int, set string) []uuid.UUID {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `INSERT INTO outbox_events (id, type, fanout, `+set+`)
		SELECT gen_random_uuid(), 'aged', '{}', `+setValues[set]+` FROM generate_series(1, $1) RETURNING id`, n)
	require.NoError(t, err)
	var ids []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	return ids
}

var setValues = map[string]string{
	"fanned_out_at":                         "now() - interval '2 hours'",
	"poisoned_at, attempts":                 "now() - interval '2 hours', 5",
	"fanned_out_at, catch_up":               "now() - interval '2 hours', ARRAY['ghost']",
	"attempts, next_attempt_at, created_at": "1, now() + interval '1 hour', now() - interval '2 hours'",
}

// Retention deletes exactly the fanned-out events older than it: never
// pending, retrying, poisoned or still-to-be-caught-up ones, nor recent ones;
// it deletes in batches of at most 5,000; and a receipt of a deleted event is
// ErrNotFound.
func TestRetentionDeletesOnlyOldFannedOutEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{config: &RelayConfig{Retention: time.Hour}}, mapSub("audit", false, "**"))
	_, err := registerSubscribers(ctx, b.pool, defaultSQL(t), []string{"ghost"})
	require.NoError(t, err)
	old := insertAged(t, b, 12_000, "fanned_out_at")
	poisoned := insertAged(t, b, 3, "poisoned_at, attempts")
	catchingUp := insertAged(t, b, 3, "fanned_out_at, catch_up")
	retrying := insertAged(t, b, 3, "attempts, next_attempt_at, created_at")
	recent := b.record(t, Event{Type: "recent"}, Event{Type: "recent"})

	var (
		mu    sync.Mutex
		sizes []int
	)
	b.relay.eng.Hooks.Pruning = func(size int) {
		mu.Lock()
		defer mu.Unlock()
		sizes = append(sizes, size)
	}
	b.relay.config.RetentionInterval = 20 * time.Millisecond
	b.start(t)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE id = ANY($1)", old).Scan(&n))
		return n == 0
	}, 30*time.Second, 20*time.Millisecond, "old fanned-out events are still there")

	rows := loadRows(t, b.pool)
	for _, ids := range [][]uuid.UUID{poisoned, catchingUp, retrying} {
		for _, id := range ids {
			require.Contains(t, rows, id, "retention deleted an event it must keep")
		}
	}
	for _, e := range recent {
		require.True(t, rows[e.ID].FannedOut)
	}
	mu.Lock()
	require.GreaterOrEqual(t, len(sizes), 3, "12,000 rows take at least three batches")
	for _, s := range sizes {
		require.LessOrEqual(t, s, maintenance.PruneBatchMax)
	}
	mu.Unlock()

	a := startAwaiter(t, b, &AwaiterConfig{NotFoundGrace: 50 * time.Millisecond})
	_, err = a.AwaitFanout(within(t, 30*time.Second), old[0])
	require.ErrorIs(t, err, ErrNotFound)
	_, err = outbox.GetEvent(ctx, b.pool, old[0])
	require.ErrorIs(t, err, ErrNotFound)
}

// A negative Retention keeps everything.
func TestNegativeRetentionKeepsEverything(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{config: &RelayConfig{Retention: -1}}, mapSub("audit", false, "**"))
	old := insertAged(t, b, 10, "fanned_out_at")
	var pruned atomic.Bool
	var passes atomic.Int32
	b.relay.eng.Hooks.Pruning = func(int) { pruned.Store(true) }
	b.relay.eng.Hooks.PrunePass = func() { passes.Add(1) }
	b.relay.config.RetentionInterval = time.Millisecond
	b.start(t)
	require.Eventually(t, func() bool { return passes.Load() >= 3 }, 30*time.Second, time.Millisecond, "retention passes ran")
	require.False(t, pruned.Load(), "a pass deleted with Retention negative")
	require.Contains(t, loadRows(t, b.pool), old[0])
}

func TestDiscardOnlyPoisonedEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	poisoned := insertAged(t, b, 1, "poisoned_at, attempts")[0]
	fanned := insertAged(t, b, 1, "fanned_out_at")[0]
	discard := func(id uuid.UUID) (int64, error) {
		return outbox.Discard(ctx, b.pool, PoisonedFilter{EventIDs: []uuid.UUID{id}})
	}
	_, err := discard(fanned)
	require.ErrorIs(t, err, ErrNotPoisoned)
	_, err = discard(uuid.Must(uuid.NewV7()))
	require.ErrorIs(t, err, ErrNotFound)
	n, err := discard(poisoned)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	_, err = outbox.GetEvent(ctx, b.pool, poisoned)
	require.ErrorIs(t, err, ErrNotFound)
	_, err = discard(poisoned)
	require.ErrorIs(t, err, ErrNotFound)
}

// Retention by whole partitions under fire (issue 31): partitions of a
// second, so the ring comes round every ten; relays that prune every 100 ms
// with a retention of 300 ms, killed mid-round and restarted; writers whose
// transactions sometimes span several rotations before they commit or roll
// back; and snapshots held now and then, some over outbox_events (which
// keeps every partition from being emptied meanwhile), some elsewhere. Every
// committed event must reach each of its subscribers exactly once (River's
// jobs, which retention never touches, are the record: the rows are gone),
// and a rolled-back one none; and partitions must have been emptied.
func TestRetentionByPartitionsSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("a 15 s soak: run without -short (CI always does)")
	}
	ctx := context.Background()
	url := testdb.URL(t)
	admin := testdb.Pool(t, url)
	exec(t, admin, "SELECT outbox_set_partition_period('1 second')")
	var emptied atomic.Int64
	// "flaky" refuses every fourth event's first attempt (in any relay):
	// owed pairs, retried after a backoff, in partitions retention looks
	// at. A pair whose event a TRUNCATE took would never be delivered.
	var refused sync.Map
	flaky := Subscriber{Name: "flaky", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			if e.ID[15]%4 == 0 {
				if _, again := refused.LoadOrStore(e.ID, true); !again {
					return nil, nil, errors.New("refused once")
				}
			}
			return testArgs{EventID: e.ID, Subject: e.Subject}, nil, nil
		}}
	type running struct {
		b      *testBundle
		cancel context.CancelFunc
	}
	// The relays' connections are named, so that the soak can kill them.
	relayPool := func() *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(url)
		require.NoError(t, err)
		cfg.ConnConfig.RuntimeParams["application_name"] = "soak-relay"
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return pool
	}
	start := func() running {
		b := setup(t, setupOpts{url: url, pool: relayPool(), config: &RelayConfig{BatchSize: 20,
			Retention: 300 * time.Millisecond, RetentionInterval: 100 * time.Millisecond,
			RetryBackoff: 50 * time.Millisecond, MaxRetryBackoff: 200 * time.Millisecond}},
			mapSub("audit", false, "**"), mapSub("mail", false, "order.*"), flaky)
		b.relay.eng.Hooks.Truncated = func(string) { emptied.Add(1) }
		rctx, cancel := context.WithCancel(ctx)
		require.NoError(t, b.relay.Start(rctx, b.client))
		return running{b, cancel}
	}
	stop := func(r running) {
		r.cancel() // mid-round, if a round is in flight
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_ = r.b.relay.Stop(sctx)
	}
	relays := []running{start(), start(), start()}

	var (
		mu         sync.Mutex
		committed  = map[uuid.UUID]string{} // ID -> type
		rolledBack = map[uuid.UUID]bool{}
		unknown    = map[uuid.UUID]bool{}
	)
	done := make(chan struct{})
	var wg sync.WaitGroup
	writer := testdb.Pool(t, url)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				typ := []string{"order.placed", "note.changed"}[(w+i)%2]
				tx, err := writer.Begin(ctx)
				if err != nil {
					continue
				}
				var ids []uuid.UUID
				for range 1 + i%3 {
					e, err := Record(ctx, tx, Event{Type: typ, Subject: fmt.Sprintf("s-%d", i%7)})
					if err != nil {
						t.Errorf("Record: %v", err)
						_ = tx.Rollback(ctx)
						return
					}
					ids = append(ids, e.ID)
				}
				if i%25 == 7 {
					time.Sleep(time.Duration(1500+100*w) * time.Millisecond) // spans rotations
				}
				if i%20 == 3 {
					if err := tx.Rollback(ctx); err != nil {
						t.Errorf("Rollback: %v", err)
						return
					}
					mu.Lock()
					for _, id := range ids {
						rolledBack[id] = true
					}
					mu.Unlock()
					continue
				}
				err = tx.Commit(ctx)
				mu.Lock()
				for _, id := range ids {
					if err == nil {
						committed[id] = typ
					} else {
						unknown[id] = true
					}
				}
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	// Snapshots held for 1.5 s in every 3: over outbox_events, then not.
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-time.After(1500 * time.Millisecond):
			}
			tx, err := admin.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
			if err != nil {
				t.Errorf("the held snapshot: %v", err)
				return
			}
			table := []string{"outbox_events", "river_job"}[i%2]
			if _, err = tx.Exec(ctx, "SELECT count(*) FROM "+table); err != nil {
				t.Errorf("the held snapshot: %v", err)
			}
			select {
			case <-done:
			case <-time.After(1500 * time.Millisecond):
			}
			_ = tx.Rollback(ctx)
		}
	})
	var killed int64
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		time.Sleep(700 * time.Millisecond)
		k := i % len(relays)
		stop(relays[k])
		relays[k] = start()
		// And a connection of some relay killed, mid-round or not: its
		// round (or listener, or River's work) dies with it.
		var n int64
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM (
			SELECT pid FROM pg_stat_activity
			 WHERE datname = current_database() AND application_name = 'soak-relay' AND state <> 'idle'
			 ORDER BY random() LIMIT 1) k`).Scan(&n))
		killed += n
		// "mail" is paused for a second in every five: its pairs are owed
		// meanwhile, across rotations, and served when it resumes.
		switch i % 7 {
		case 2:
			require.NoError(t, outbox.PauseSubscriber(ctx, admin, "mail"))
		case 4:
			require.NoError(t, outbox.ResumeSubscriber(ctx, admin, "mail"))
		}
	}
	require.NoError(t, outbox.ResumeSubscriber(ctx, admin, "mail"))
	close(done)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, committed)
	require.NotEmpty(t, rolledBack)
	// Every committed event reaches its subscribers, within a bound far
	// beyond a healthy drain (a second or two).
	want := 0
	for _, typ := range committed {
		want += 2 // audit, flaky
		if strings.HasPrefix(typ, "order.") {
			want++
		}
	}
	require.Eventually(t, func() bool {
		var jobs int
		require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM river_job").Scan(&jobs))
		return jobs >= want
	}, 60*time.Second, 50*time.Millisecond, "the committed events' jobs never all came")
	for _, r := range relays {
		stop(r)
	}
	jobs := map[string]map[uuid.UUID]int{}
	for _, j := range loadJobs(t, admin) {
		if jobs[j.Subscriber] == nil {
			jobs[j.Subscriber] = map[uuid.UUID]int{}
		}
		jobs[j.Subscriber][j.EventID]++
	}
	for id, typ := range committed {
		require.Equal(t, 1, jobs["audit"][id], "audit's jobs for %s", id)
		require.Equal(t, 1, jobs["flaky"][id], "flaky's jobs for %s", id)
		mail := 0
		if strings.HasPrefix(typ, "order.") {
			mail = 1
		}
		require.Equal(t, mail, jobs["mail"][id], "mail's jobs for %s (%s)", id, typ)
	}
	for id := range rolledBack {
		require.Zero(t, jobs["audit"][id]+jobs["mail"][id]+jobs["flaky"][id], "a rolled-back event has jobs: %s", id)
	}
	for id := range unknown {
		require.LessOrEqual(t, jobs["audit"][id], 1, "audit's jobs for %s", id)
		require.LessOrEqual(t, jobs["flaky"][id], 1, "flaky's jobs for %s", id)
	}
	t.Logf("%d events committed, %d rolled back, %d of unknown outcome; %d partitions emptied; %d relay connections killed",
		len(committed), len(rolledBack), len(unknown), emptied.Load(), killed)
	require.Positive(t, emptied.Load(), "retention never emptied a partition")
}

// A relay that runs as a role granted the outbox table (not its owner)
// before migration 020 reads, locks and empties the partitions: 020 gives
// every partition the table's grants, TRUNCATE to whoever may DELETE.
func TestRetentionEmptiesPartitionsAsARoleGrantedTheTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.EmptyURL(t)
	admin := testdb.Pool(t, url)
	require.NoError(t, migrate(ctx, admin, outbox, 18))
	role := newRole(t, admin, "relay")
	exec(t, admin, "GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_events, outbox_deliveries TO "+role)
	require.NoError(t, outbox.Migrate(ctx, admin))
	// Expired rows in a slot that is neither this period's nor the one before.
	exec(t, admin, `INSERT INTO outbox_events (id, type, fanout, fanned_out_at, slot)
		SELECT gen_random_uuid(), 'aged', '{}', now() - interval '2 days', (outbox_slot_of(now()) + 5) % 10
		  FROM generate_series(1, 100)`)

	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET ROLE "+role)
		return err
	}
	relayPool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(relayPool.Close)

	var logs bytes.Buffer
	var emptied []string
	p := &maintenance.Pruner{
		DB: relayPool, SQL: defaultSQL(t), Retention: time.Hour, Interval: time.Minute,
		Logger:     slog.New(slog.NewTextHandler(&logs, nil)),
		OnTruncate: func(part string) { emptied = append(emptied, part) },
	}
	p.Pass(ctx, make(chan struct{}))
	t.Logf("logs: %s", logs.String())
	require.NotEmpty(t, emptied, "no partition emptied by a relay granted outbox_events")
}
