package events

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

// The design's scenario: A inserts first (lower seq) but commits after B has
// been fanned out. A cursor relay would have moved past A's seq and lost it.
func TestClaimsByRowNotCursor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	b.start(t)
	b.waitIdle(t)

	txA, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer txA.Rollback(ctx)
	evA, err := Record(ctx, txA, Event{Type: "note.changed", Subject: "a"})
	require.NoError(t, err)

	evB := b.record(t, Event{Type: "note.changed", Subject: "b"})[0]
	require.Greater(t, evB.Seq, evA.Seq, "A must hold the lower seq")
	require.Eventually(t, func() bool { return loadRows(t, b.pool)[evB.ID].FannedOut }, 10*time.Second, 5*time.Millisecond)

	require.NoError(t, txA.Commit(ctx))
	waitFannedOut(t, b.pool, 10*time.Second)
	rows := loadRows(t, b.pool)
	require.True(t, rows[evA.ID].FannedOut)
	require.Len(t, rows[evA.ID].Fanout, 1)
	require.Len(t, loadJobs(t, b.pool), 2)
}

func TestBatchSizeBoundsEachRound(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	es := make([]Event, 2000)
	for i := range es {
		es[i] = Event{Type: "doc.imported", Subject: fmt.Sprintf("doc:%d", i)}
	}
	b.record(t, es...)
	b.start(t)
	waitFannedOut(t, b.pool, 60*time.Second)

	// Each round is one transaction, so its rows share one fanned_out_at.
	rows, err := b.pool.Query(context.Background(),
		"SELECT count(*) FROM outbox_events GROUP BY fanned_out_at ORDER BY 1 DESC")
	require.NoError(t, err)
	sizes, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(sizes), 10)
	require.LessOrEqual(t, sizes[0], 200, "a round claimed more than BatchSize rows")
	require.Len(t, loadJobs(t, b.pool), 2000)
}

func TestBatchSizeIsConfigurable(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{config: &RelayConfig{BatchSize: 7}}, mapSub("audit", false, "**"))
	es := make([]Event, 50)
	for i := range es {
		es[i] = Event{Type: "doc.imported"}
	}
	b.record(t, es...)
	b.start(t)
	waitFannedOut(t, b.pool, 30*time.Second)
	var biggest int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT max(n) FROM (SELECT count(*) AS n FROM outbox_events GROUP BY fanned_out_at) s").Scan(&biggest))
	require.Equal(t, 7, biggest)
}

// Four relays, each with its own pool and River client (as four processes
// would), drain 5,000 events recorded while they run.
func TestManyRelaysFanOutExactlyOnce(t *testing.T) {
	t.Parallel()
	subs := []Subscriber{
		mapSub("webhooks", false, "**"),
		mapSub("mail", false, "order.*"),
		mapSub("search", true, "**"),
	}
	first := setup(t, setupOpts{}, subs...)
	bundles := []*testBundle{first}
	for range 3 {
		bundles = append(bundles, setup(t, setupOpts{url: first.url}, subs...))
	}
	for _, b := range bundles {
		b.start(t)
	}

	const writers, perWriter = 5, 1000
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWriter; i += 50 {
				batch := make([]Event, 50)
				for j := range batch {
					typ := "order.placed"
					if j%3 == 0 {
						typ = "note.changed"
					}
					batch[j] = Event{Type: typ, Subject: fmt.Sprintf("s%d", (w*perWriter+i+j)%40)}
				}
				first.record(t, batch...)
			}
		}()
	}
	wg.Wait()
	waitFannedOut(t, first.pool, 120*time.Second)

	rows := loadRows(t, first.pool)
	jobs := loadJobs(t, first.pool)
	require.Len(t, rows, writers*perWriter)
	perSub := map[string]map[uuid.UUID]int{"webhooks": {}, "mail": {}, "search": {}}
	for _, j := range jobs {
		perSub[j.Subscriber][j.EventID]++
	}
	for _, r := range rows {
		require.True(t, r.FannedOut)
		require.Equal(t, 1, perSub["webhooks"][r.ID], "webhooks jobs for %s", r.ID)
		if r.Type == "order.placed" {
			require.Equal(t, 1, perSub["mail"][r.ID], "mail jobs for %s", r.ID)
		} else {
			require.Zero(t, perSub["mail"][r.ID])
		}
		for sub, jobID := range r.Fanout {
			job, ok := jobs[jobID]
			require.True(t, ok, "fanout of %s names job %d, which does not exist", r.ID, jobID)
			require.Equal(t, sub, job.Subscriber)
			if sub == "search" {
				carried := rows[job.EventID]
				require.Equal(t, r.Subject, carried.Subject)
				require.GreaterOrEqual(t, carried.Seq, r.Seq)
			} else {
				require.Equal(t, r.ID, job.EventID, "fanout of %s names a job for another event", r.ID)
			}
		}
	}
	// Every job is named by some fanout.
	named := map[int64]bool{}
	for _, r := range rows {
		for _, id := range r.Fanout {
			named[id] = true
		}
	}
	require.Len(t, named, len(jobs))
}

// A relay whose connection dies after inserting jobs and before committing
// leaves nothing behind; the rows go out once afterwards.
func TestCrashMidRoundLeavesNoTrace(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{config: &RelayConfig{RetryBackoff: 10 * time.Millisecond}}, mapSub("audit", false, "**"), mapSub("search", true, "**"))
	admin := testdb.Pool(t, b.url)
	var once sync.Once
	checked := make(chan error, 1)
	b.relay.hooks.afterInsert = func(ctx context.Context, tx pgx.Tx) {
		once.Do(func() {
			var pid int
			if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				checked <- err
				return
			}
			var jobsInTx int
			_ = tx.QueryRow(ctx, "SELECT count(*) FROM river_job").Scan(&jobsInTx)
			if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
				checked <- err
				return
			}
			// Wait for the backend to be gone, then look from outside.
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				var alive bool
				_ = admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", pid).Scan(&alive)
				if !alive {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			var jobs, stamped int
			_ = admin.QueryRow(ctx, "SELECT count(*) FROM river_job").Scan(&jobs)
			_ = admin.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE fanned_out_at IS NOT NULL").Scan(&stamped)
			if jobsInTx == 0 || jobs != 0 || stamped != 0 {
				checked <- fmt.Errorf("jobs inside the round %d; after the crash: %d jobs, %d stamped rows", jobsInTx, jobs, stamped)
				return
			}
			checked <- nil
		})
	}
	es := make([]Event, 30)
	for i := range es {
		es[i] = Event{Type: "note.changed", Subject: fmt.Sprintf("n%d", i%10)}
	}
	b.record(t, es...)
	b.start(t)
	select {
	case err := <-checked:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the round never reached the crash point")
	}
	waitFannedOut(t, b.pool, 30*time.Second)
	rows := loadRows(t, b.pool)
	jobs := loadJobs(t, b.pool)
	audit := 0
	for _, j := range jobs {
		if j.Subscriber == "audit" {
			audit++
		}
	}
	require.Equal(t, 30, audit, "one audit job per event, none left from the crashed round")
	for _, r := range rows {
		require.Zero(t, r.Attempts, "a crash is not the row's fault")
		require.Len(t, r.Fanout, 2)
		for _, id := range r.Fanout {
			require.Contains(t, jobs, id)
		}
	}
}

func TestEverySubjectEventReachesANonCoalescingSubscriber(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, mapSub("webhooks", false, "supplier.**"))
	es := b.record(t,
		Event{Type: "supplier.connected", Subject: "supplier:7"},
		Event{Type: "supplier.activated", Subject: "supplier:7"},
		Event{Type: "supplier.connected", Subject: "supplier:8"},
	)
	b.start(t)
	waitFannedOut(t, b.pool, 10*time.Second)
	rows := loadRows(t, b.pool)
	jobs := loadJobs(t, b.pool)
	require.Len(t, jobs, 3)
	seen := map[int64]bool{}
	for _, e := range es {
		id := rows[e.ID].Fanout["webhooks"]
		require.Equal(t, e.ID, jobs[id].EventID, "%s got another event's job", e.Type)
		require.False(t, seen[id])
		seen[id] = true
	}
}

func TestCoalescingSubscriberGetsOneJobPerSubjectForTheLatestEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, mapSub("search", true, "supplier.**"), mapSub("webhooks", false, "supplier.**"))
	es := b.record(t,
		Event{Type: "supplier.connected", Subject: "supplier:7"},
		Event{Type: "supplier.renamed", Subject: "supplier:8"},
		Event{Type: "supplier.activated", Subject: "supplier:7"},
		Event{Type: "supplier.renamed", Subject: "supplier:7"},
		Event{Type: "supplier.pinged"}, // no subject: never coalesced
		Event{Type: "supplier.pinged"},
	)
	b.start(t)
	waitFannedOut(t, b.pool, 10*time.Second)
	rows := loadRows(t, b.pool)
	jobs := loadJobs(t, b.pool)

	search := map[int64]bool{}
	for _, j := range jobs {
		if j.Subscriber == "search" {
			search[j.ID] = true
		}
	}
	require.Len(t, search, 4, "supplier:7, supplier:8, and one per subject-less event")
	latest7 := es[3]
	for _, e := range es[:4] {
		id := rows[e.ID].Fanout["search"]
		if e.Subject == "supplier:7" {
			require.Equal(t, latest7.ID, jobs[id].EventID, "earlier events of a subject name the latest event's job")
		} else {
			require.Equal(t, e.ID, jobs[id].EventID)
		}
	}
	require.NotEqual(t, rows[es[4].ID].Fanout["search"], rows[es[5].ID].Fanout["search"])
	// The non-coalescing subscriber beside it still gets every event.
	webhooks := 0
	for _, j := range jobs {
		if j.Subscriber == "webhooks" {
			webhooks++
		}
	}
	require.Equal(t, len(es), webhooks)
}

func TestRowsMatchingNoSubscriberAreStamped(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, mapSub("mail", false, "order.*"))
	es := b.record(t, Event{Type: "note.changed"}, Event{Type: "order.placed"})
	b.start(t)
	waitFannedOut(t, b.pool, 10*time.Second)
	rows := loadRows(t, b.pool)
	require.Empty(t, rows[es[0].ID].Fanout)
	require.NotNil(t, rows[es[0].ID].Fanout, "stamped with an empty fanout, not NULL")
	require.Len(t, rows[es[1].ID].Fanout, 1)
}

func TestMapReturningNilArgsSkipsTheSubscriber(t *testing.T) {
	t.Parallel()
	sub := Subscriber{Name: "picky", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			if e.Subject == "skip" {
				return nil, nil, nil
			}
			return testArgs{EventID: e.ID}, &river.InsertOpts{Metadata: []byte(`{"tenant":"t1"}`), Tags: []string{"tenant-t1"}}, nil
		}}
	b := setup(t, setupOpts{}, sub)
	es := b.record(t, Event{Type: "a", Subject: "skip"}, Event{Type: "a", Subject: "keep"})
	b.start(t)
	waitFannedOut(t, b.pool, 10*time.Second)
	rows := loadRows(t, b.pool)
	require.Empty(t, rows[es[0].ID].Fanout)
	require.Len(t, rows[es[1].ID].Fanout, 1)
	var (
		tenant string
		tags   []string
	)
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT metadata->>'tenant', tags FROM river_job WHERE id = $1",
		rows[es[1].ID].Fanout["picky"]).Scan(&tenant, &tags))
	require.Equal(t, "t1", tenant, "the host's metadata is kept")
	require.Equal(t, []string{"tenant-t1", "events-subscriber-picky"}, tags,
		"the host's tags are kept beside the relay's")
}

// taggedArgs declare their own tags, as River lets job args do.
type taggedArgs struct{ testArgs }

func (taggedArgs) Kind() string { return "test.tagged" }
func (taggedArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Tags: []string{"billing"}}
}

func TestTheArgsOwnTagsAreKept(t *testing.T) {
	t.Parallel()
	sub := Subscriber{Name: "billing", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			return taggedArgs{testArgs{EventID: e.ID}}, nil, nil
		}}
	b := setup(t, setupOpts{}, sub)
	e := b.record(t, Event{Type: "invoice.paid"})[0]
	b.start(t)
	waitFannedOut(t, b.pool, 10*time.Second)
	var tags []string
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT tags FROM river_job WHERE id = $1",
		loadRows(t, b.pool)[e.ID].Fanout["billing"]).Scan(&tags))
	require.Equal(t, []string{"billing", "events-subscriber-billing"}, tags)
}

func TestRolledBackRecordIsNeverFannedOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	b.start(t)
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = Record(ctx, tx, Event{Type: "note.changed"})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	kept := b.record(t, Event{Type: "note.kept"})[0]
	waitFannedOut(t, b.pool, 10*time.Second)
	rows := loadRows(t, b.pool)
	require.Len(t, rows, 1)
	require.Contains(t, rows, kept.ID)
	require.Len(t, loadJobs(t, b.pool), 1)
}

func TestHandlerSeesTheFullEventAndErrorsAreRetriedByRiver(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		seen []Event
	)
	done := make(chan struct{})
	sub := Subscriber{Name: "indexer", Types: []string{"note.*"},
		InsertOpts: &river.InsertOpts{MaxAttempts: 5},
		Handle: func(ctx context.Context, e Event) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, e)
			if len(seen) == 1 {
				return errors.New("search cluster unavailable")
			}
			close(done)
			return nil
		}}
	// River's default retry waits seconds; this test wants the retry now.
	b := setup(t, setupOpts{work: true, retryPolicy: immediateRetry{}}, sub)
	b.start(t)
	want := b.record(t, Event{Type: "note.changed", Subject: "note:1", Payload: []byte(`{"title":"hello"}`)})[0]
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("handler never succeeded")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 2)
	for _, got := range seen {
		require.Equal(t, want.ID, got.ID)
		require.Equal(t, want.Seq, got.Seq)
		require.Equal(t, "note.changed", got.Type)
		require.Equal(t, "note:1", got.Subject)
		require.JSONEq(t, `{"title":"hello"}`, string(got.Payload))
		require.WithinDuration(t, want.CreatedAt, got.CreatedAt, time.Microsecond)
	}
	var attempt int
	require.Eventually(t, func() bool {
		err := b.pool.QueryRow(context.Background(), "SELECT attempt FROM river_job WHERE kind = 'events.handle' AND state = 'completed'").Scan(&attempt)
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, 2, attempt)
}

type immediateRetry struct{}

func (immediateRetry) NextRetry(*rivertype.JobRow) time.Time { return time.Now() }

// A round's own transaction commits without waiting for its WAL flush (a
// lost round is redone whole: see roundTx) and merges River's GIN pending
// lists at 128 kB (RoundSettings); a FanOutTx round is the caller's
// transaction, whose settings the caller decides.
func TestARoundCommitsAsynchronouslyAndFanOutTxLeavesTheCallersCommitAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The test servers run with synchronous_commit off; this database's
	// sessions have it on, as production's do.
	url := testdb.URL(t)
	_, err := testdb.Pool(t, url).Exec(ctx, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = on', current_database()); END $$`)
	require.NoError(t, err)
	b := setup(t, setupOpts{url: url}, mapSub("audit", false, "**"))
	settings := make(chan string, 4)
	b.relay.hooks.afterInsert = func(ctx context.Context, tx pgx.Tx) {
		var s, gin string
		if err := tx.QueryRow(ctx, "SELECT current_setting('synchronous_commit'), current_setting('gin_pending_list_limit')").Scan(&s, &gin); err != nil {
			s = err.Error()
		}
		settings <- s + " " + gin
	}
	b.record(t, Event{Type: "a"})
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := b.relay.FanOutTx(ctx, tx, b.client)
		return err
	}))
	require.Equal(t, "on 4MB", <-settings, "FanOutTx changed the caller's settings")

	b.record(t, Event{Type: "b"})
	b.start(t)
	require.Equal(t, "off 128kB", <-settings, "the relay's round waits for its WAL flush, or leaves River's GIN pending lists at 4 MB")
}

// A round of the relay's own costs two round trips of its own beside River's
// job insert: the BEGIN, its setting and the claim together; the stamp, the
// receipts' notification and the COMMIT together. (River adds its own
// queries: a version probe once, an insert notification now and then.)
func TestARoundTakesTwoRoundTripsBesideItsInsert(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	trips := &roundTrips{}
	cfg.ConnConfig.Tracer = trips
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := setup(t, setupOpts{url: url, pool: pool}, mapSub("audit", false, "**"), mapSub("mail", false, "**"))
	b.start(t)
	b.settle(t)
	ev := b.record(t, Event{Type: "a"})[0]
	require.Eventually(t, func() bool { return loadRows(t, b.pool)[ev.ID].FannedOut }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, b.relay.Stop(ctx))

	round := trips.roundOf(b.relay.sql.ClaimBatch, b.relay.sql.Commit, ev.ID.String())
	require.NotNil(t, round, "no round fanned the event out: %v", trips.all())
	var ours []string
	inserts := 0
	for _, op := range round {
		switch {
		case strings.HasPrefix(op, "-- name: JobInsert"):
			inserts++
		case !strings.HasPrefix(op, "-- name: "): // River's queries are named so
			ours = append(ours, op)
		}
	}
	require.Equal(t, 1, inserts, "River's job inserts in the round: %q", round)
	require.Len(t, ours, 2, "the library's round trips in the round: %q", ours)
	require.Contains(t, ours[0], "begin read write")
	require.Contains(t, ours[1], b.relay.sql.Stamp)
}

// roundTrips records, per connection, what each round trip sent: a query's
// SQL, or a batch's, joined.
type roundTrips struct {
	mu     sync.Mutex
	byConn map[*pgx.Conn][]string
}

func (r *roundTrips) add(c *pgx.Conn, what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byConn == nil {
		r.byConn = map[*pgx.Conn][]string{}
	}
	r.byConn[c] = append(r.byConn[c], what)
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.add(c, d.SQL+fmt.Sprint(d.Args))
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	var parts []string
	for _, q := range d.Batch.QueuedQueries {
		parts = append(parts, q.SQL+fmt.Sprint(q.Arguments))
	}
	r.add(c, strings.Join(parts, " ; "))
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// roundOf returns the round trips of a round on one connection, from the
// one that sent claim to the one that ended it (commit, or pgx's own
// "commit"), if any of them names mark; nil if none does.
func (r *roundTrips) roundOf(claim, commit, mark string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ops := range r.byConn {
		from := -1
		for i, op := range ops {
			if strings.Contains(op, claim) {
				from = i
			}
			ends := strings.Contains(op, commit+"[]") || op == "commit[]"
			if from < 0 || !ends {
				continue
			}
			if strings.Contains(strings.Join(ops[from:i+1], " "), mark) {
				return ops[from : i+1]
			}
			from = -1
		}
	}
	return nil
}

func (r *roundTrips) all() map[*pgx.Conn][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.byConn)
}
