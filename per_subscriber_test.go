package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	osexec "os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// registerOther registers a subscriber as another release's relay would,
// with its type globs, without running it.
func registerOther(t *testing.T, b *testBundle, s Subscriber) {
	t.Helper()
	sub, err := newSubscription(s)
	require.NoError(t, err)
	_, err = registerSubscribers(context.Background(), b.pool, defaultSQL(t), []string{s.Name}, sub)
	require.NoError(t, err)
}

// A subscriber registered by a deploy that was rolled back, and never run
// again: it is owed only the events its types match; once no relay has
// served it for OrphanAfter it is reported orphaned by Health, Stats and a
// warning naming the fix; retention deletes every event that owes nothing
// and keeps the ones owed to it; retiring it lets retention take those too.
func TestAnOrphanedSubscriberIsReportedAndRetentionPrunesWhatOwesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Long enough that the relay's own heartbeats (every OrphanAfter / 3)
	// keep its subscriber served on a busy machine under -race.
	const orphanAfter = 2 * time.Second
	logs := &syncBuffer{}
	b := setup(t, setupOpts{config: &RelayConfig{
		Outbox: Outbox{OrphanAfter: orphanAfter}, Retention: time.Millisecond, RetentionInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}}, mapSub("x", false, "**"))
	registered := time.Now() // before ghost's registration: no later than its last_served_at
	registerOther(t, b, mapSub("ghost", false, "order.*"))
	b.start(t)
	b.settle(t)
	es := make([]Event, 40)
	for i := range es {
		es[i] = Event{Type: []string{"order.placed", "note.changed"}[i%2]}
	}
	es = b.record(t, es...)
	waitFannedOut(t, b.pool, 10*time.Second)
	// Not before OrphanAfter: reported orphaned now, it must be OrphanAfter
	// since its registration (on a busy machine the events may take that
	// long to fan out).
	if orphaned := b.relay.Health().Orphaned; len(orphaned) > 0 {
		require.GreaterOrEqual(t, time.Since(registered), orphanAfter, "orphaned before OrphanAfter: %v", orphaned)
	}

	require.Eventually(t, func() bool { return len(b.relay.Health().Orphaned) == 1 }, orphanAfter+5*time.Second, 5*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(registered), orphanAfter)
	require.Equal(t, []string{"ghost"}, b.relay.Health().Orphaned)
	require.True(t, b.relay.Healthy(), "an orphan is not this relay's fault")
	st, err := Outbox{OrphanAfter: orphanAfter}.Stats(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, []string{"ghost"}, st.Orphaned)
	require.EqualValues(t, 20, st.Owed, "only the events ghost's types match are owed to it")
	st, err = outbox.Stats(ctx, b.pool)
	require.NoError(t, err)
	require.Empty(t, st.Orphaned, "the default OrphanAfter is 15 minutes")
	require.Contains(t, logs.String(), "subscriber=ghost")
	require.Contains(t, logs.String(), "RetireSubscriber")

	// Retention: every event that owes nothing goes; the owed ones stay.
	require.Eventually(t, func() bool { return len(loadRows(t, b.pool)) == 20 }, 10*time.Second, 10*time.Millisecond)
	rows := loadRows(t, b.pool)
	for _, e := range es {
		_, kept := rows[e.ID]
		require.Equal(t, e.Type == "order.placed", kept, "event %s (%s)", e.ID, e.Type)
	}
	relays, err := outbox.ListRelays(ctx, b.pool)
	require.NoError(t, err)
	require.Len(t, relays, 1)
	require.Equal(t, []string{"x"}, relays[0].Subscribers)
	require.Equal(t, os.Getpid(), relays[0].PID)
	require.True(t, relays[0].StoppedAt.IsZero())

	require.NoError(t, outbox.RetireSubscriber(ctx, b.pool, "ghost"))
	require.Eventually(t, func() bool { return len(loadRows(t, b.pool)) == 0 }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return len(b.relay.Health().Orphaned) == 0 }, 5*time.Second, 5*time.Millisecond)
}

// RetireSubscriber while relays stamp: a relay that lacks the subscriber
// keeps writing pairs owed to it, and one that knows it serves them; once
// RetireSubscriber returns, nothing owes the retired name, and nothing ever
// does again (no stamp in flight writes it back). 50 times.
func TestRetireSubscriberWhileRelaysStamp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	loops := 50
	if testing.Short() {
		loops = 10
	}
	for i := range loops {
		lacking := setup(t, setupOpts{config: &RelayConfig{BatchSize: 20}}, mapSub("x", false, "**"))
		registerOther(t, lacking, mapSub("gone", false, "**"))
		lacking.start(t)
		func() {
			var (
				stop    = make(chan struct{})
				stopped bool
				writers sync.WaitGroup
			)
			halt := func() {
				if !stopped {
					stopped = true
					close(stop)
					writers.Wait()
				}
			}
			defer halt()
			for range 2 {
				writers.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						if err := pgx.BeginFunc(ctx, lacking.pool, func(tx pgx.Tx) error {
							_, err := RecordMany(ctx, tx, []Event{{Type: "a"}, {Type: "b"}, {Type: "c"}, {Type: "d"}})
							return err
						}); err != nil {
							t.Errorf("recording: %v", err)
							return
						}
					}
				})
			}
			// Let pairs pile up, then retire in the middle of it.
			require.Eventually(t, func() bool { return owedCount(t, lacking.pool) >= 20 }, 10*time.Second, time.Millisecond)
			require.NoError(t, outbox.RetireSubscriber(ctx, lacking.pool, "gone"))
			owedToGone := func() int {
				var n int
				require.NoError(t, lacking.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_deliveries WHERE subscriber = 'gone')
					+ (SELECT count(*) FROM outbox_events WHERE catch_up @> ARRAY['gone'])`).Scan(&n))
				return n
			}
			require.Zero(t, owedToGone(), "loop %d: owed to the retired name right after RetireSubscriber", i)
			halt()
			waitFannedOut(t, lacking.pool, 10*time.Second)
			require.Zero(t, owedToGone(), "loop %d: a stamp in flight wrote the retired name back", i)
		}()
		require.NoError(t, lacking.relay.Stop(ctx))
	}
}

// An old-style catch_up list, written by a relay of 0.1.0 during a rolling
// deploy (with 0.1.0's own stamp statement), is served by a relay of this
// version that knows the subscriber: exactly one job, fanout extended, the
// list cleared; names it lists that are retired are dropped.
func TestAnOldReleasesCatchUpListIsServed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	raw, err := os.ReadFile("testdata/v0.1.0_statements.json")
	require.NoError(t, err)
	var old map[string]string
	require.NoError(t, json.Unmarshal(raw, &old))

	b := setup(t, setupOpts{}, mapSub("x", false, "**"), mapSub("y", false, "order.*"))
	// The registry as the deploy left it: y registered by the new release,
	// z by one since retired.
	registerOther(t, b, mapSub("y", false, "order.*"))
	registerOther(t, b, mapSub("z", false, "**"))
	require.NoError(t, outbox.RetireSubscriber(ctx, b.pool, "z"))
	es := b.record(t, Event{Type: "order.placed"}, Event{Type: "note.changed"})
	// An old relay knowing only x claims and stamps them: catch_up = {y}.
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, old["ClaimBatch"], 10); err != nil {
			return err
		}
		var seqs []int64
		for _, e := range es {
			seqs = append(seqs, e.Seq)
		}
		_, err := tx.Exec(ctx, old["Stamp"], seqs, []string{`{"x":1}`, `{"x":2}`}, []string{"x"})
		return err
	}))
	_, err = b.pool.Exec(ctx, "UPDATE outbox_events SET catch_up = catch_up || ARRAY['z'] WHERE seq = $1", es[0].Seq)
	require.NoError(t, err)
	require.Equal(t, 2, owedCount(t, b.pool), "0.1.0 wrote catch_up lists")

	b.start(t)
	waitDelivered(t, b.pool, 10*time.Second)
	rows := loadRows(t, b.pool)
	jobs := loadJobs(t, b.pool)
	require.Len(t, jobs, 1, "one job: y's, for the order event")
	for _, j := range jobs {
		require.Equal(t, "y", j.Subscriber)
		require.Equal(t, es[0].ID, j.EventID)
		require.Equal(t, map[string]int64{"x": 1, "y": j.ID}, rows[es[0].ID].Fanout)
	}
	require.Equal(t, map[string]int64{"x": 2}, rows[es[1].ID].Fanout, "y's types do not match the note")
	require.Empty(t, loadPairs(t, b.pool))
}

// Migration 006 carries 0.1.0's catch_up lists over into owed pairs, and a
// catch-up that 0.1.0 poisoned into a poisoned pair of an event no longer
// poisoned as a whole.
func TestMigrationCarriesCatchUpListsOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.EmptyURL(t))
	require.NoError(t, migrate(ctx, pool, outbox, 4))
	exec(t, pool, `INSERT INTO outbox_subscribers (name) VALUES ('x'), ('y'), ('old')`)
	exec(t, pool, `UPDATE outbox_subscribers SET retired_at = now() WHERE name = 'old'`)
	exec(t, pool, `INSERT INTO outbox_events (id, type, fanned_out_at, fanout, catch_up) VALUES
		('0194f1c6-7d6a-7000-8000-000000000001', 'a', now(), '{"x": 1}', ARRAY['y', 'old']),
		('0194f1c6-7d6a-7000-8000-000000000002', 'a', now(), '{"x": 2}', NULL)`)
	exec(t, pool, `INSERT INTO outbox_events (id, type, fanned_out_at, fanout, catch_up, attempts, last_error, poisoned_at) VALUES
		('0194f1c6-7d6a-7000-8000-000000000003', 'a', now(), '{"x": 3}', ARRAY['y'], 5, 'y failed', now())`)
	require.NoError(t, outbox.Migrate(ctx, pool))
	pairs := loadPairs(t, pool)
	require.Len(t, pairs, 2)
	require.Equal(t, pairRow{}, pairs[uuid.MustParse("0194f1c6-7d6a-7000-8000-000000000001")]["y"])
	require.Equal(t, pairRow{Attempts: 5, LastError: "y failed", Errors: 1, Poisoned: true},
		pairs[uuid.MustParse("0194f1c6-7d6a-7000-8000-000000000003")]["y"])
	rows := loadRows(t, pool)
	for _, r := range rows {
		require.False(t, r.Poisoned, "event %s is fanned out: only its pair is poisoned", r.ID)
	}
	var lists int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE catch_up IS NOT NULL").Scan(&lists))
	require.Zero(t, lists)
}

// A paused subscriber is attempted for nothing while paused: its events stay
// owed to it and the other subscribers' flow; resumed, it gets each once.
func TestPausedSubscriberIsOwedAndResumed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var calls atomic.Int32
	slow := Subscriber{Name: "slow", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			calls.Add(1)
			return testArgs{EventID: e.ID}, nil, nil
		}}
	b := setup(t, setupOpts{}, slow, mapSub("fast", false, "**"))
	b.start(t)
	b.settle(t)
	require.NoError(t, outbox.PauseSubscriber(ctx, b.pool, "slow"))
	require.ErrorIs(t, outbox.PauseSubscriber(ctx, b.pool, "nobody"), ErrUnknownSubscriber)
	es := b.record(t, Event{Type: "a"}, Event{Type: "b"}, Event{Type: "c"})
	waitFannedOut(t, b.pool, 10*time.Second)
	require.Eventually(t, func() bool { return len(loadJobs(t, b.pool)) == 3 }, 10*time.Second, 5*time.Millisecond)
	b.waitIdle(t)
	require.Zero(t, calls.Load(), "nothing is attempted for a paused subscriber")
	pairs := loadPairs(t, b.pool)
	for _, e := range es {
		require.Equal(t, pairRow{}, pairs[e.ID]["slow"], "event %s is owed to slow", e.ID)
	}
	st, err := outbox.Stats(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, []string{"slow"}, st.Paused)
	require.EqualValues(t, 3, st.Owed)

	require.NoError(t, outbox.ResumeSubscriber(ctx, b.pool, "slow"))
	waitDelivered(t, b.pool, 10*time.Second)
	perPair := map[string]int{}
	for _, j := range loadJobs(t, b.pool) {
		perPair[j.Subscriber+" "+j.EventID.String()]++
	}
	require.Len(t, perPair, 6)
	for pair, n := range perPair {
		require.Equal(t, 1, n, pair)
	}
	require.EqualValues(t, 3, calls.Load())
}

// A subscriber's error is stored safely whatever its bytes — a multi-byte
// rune across the cut, a NUL byte, a megabyte — and OnPoison gets it as the
// subscriber returned it.
func TestPairErrorsAreStoredSafely(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	long := strings.Repeat("é", 1<<19) // 1 MiB, two bytes a rune
	msgs := map[string]string{
		"rune": strings.Repeat("a", maxPairErrorLength-3) + "€€",
		"nul":  "bad\x00byte",
		"huge": long,
	}
	var (
		mu  sync.Mutex
		got = map[string]error{}
	)
	sub := Subscriber{Name: "picky", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			return nil, nil, errors.New(msgs[e.Subject])
		}}
	b := setup(t, setupOpts{config: &RelayConfig{MaxAttempts: 1, OnPoison: func(_ context.Context, e Event, err error) {
		mu.Lock()
		defer mu.Unlock()
		got[e.Subject] = err
	}}}, sub)
	b.start(t)
	es := b.record(t, Event{Type: "a", Subject: "rune"}, Event{Type: "a", Subject: "nul"}, Event{Type: "a", Subject: "huge"})
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 3 }, 10*time.Second, 5*time.Millisecond)
	for _, e := range es {
		info, err := outbox.Inspect(ctx, b.pool, e.ID)
		require.NoError(t, err)
		require.Len(t, info.Deliveries, 1)
		d := info.Deliveries[0]
		require.True(t, d.Poisoned())
		require.LessOrEqual(t, len(d.LastError), maxPairErrorLength)
		require.NotContains(t, d.LastError, "\x00")
		require.Equal(t, d.LastError, d.Errors[0].Error)
		mu.Lock()
		require.ErrorContains(t, got[e.Subject], msgs[e.Subject], "OnPoison gets the error as written")
		mu.Unlock()
		switch e.Subject {
		case "nul":
			require.Contains(t, d.LastError, `bad\x00byte`)
		case "rune", "huge":
			require.True(t, strings.HasSuffix(d.LastError, "…"), "cut, and the cut is marked")
		}
	}
}

// Receipts per subscriber: AwaitFanout answers at fan-out and names the
// pairs still owed; AwaitDelivery waits until a named subscriber's pair is
// delivered, or reports it poisoned, or answers at once for a subscriber the
// event does not match.
func TestReceiptsPerSubscriber(t *testing.T) {
	t.Parallel()
	var flakyCalls atomic.Int32
	flaky := Subscriber{Name: "flaky", Types: []string{"order.*"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			if flakyCalls.Add(1) <= 2 {
				return nil, nil, errors.New("warming up")
			}
			return testArgs{EventID: e.ID}, nil, nil
		}}
	broken := Subscriber{Name: "broken", Types: []string{"order.*"},
		Map: func(context.Context, Event) (river.JobArgs, *river.InsertOpts, error) {
			return nil, nil, errors.New("never")
		}}
	b := setup(t, setupOpts{config: &RelayConfig{MaxAttempts: 3, RetryBackoff: 100 * time.Millisecond, MaxRetryBackoff: 100 * time.Millisecond}},
		flaky, broken, mapSub("fast", false, "**"))
	a := startAwaiter(t, b, nil)
	b.start(t)
	e := b.record(t, Event{Type: "order.placed"})[0]

	rcpt, err := a.AwaitFanout(within(t, 10*time.Second), e.ID)
	require.NoError(t, err)
	require.Contains(t, rcpt[0].Fanout, "fast")
	require.Equal(t, []string{"broken", "flaky"}, rcpt[0].Owed, "answered at fan-out, before the retries")

	rcpt, err = a.AwaitDelivery(within(t, 10*time.Second), "flaky", e.ID)
	require.NoError(t, err)
	require.NotZero(t, rcpt[0].Fanout["flaky"], "waited for the retry that delivered it")
	require.EqualValues(t, 3, flakyCalls.Load())

	_, err = a.AwaitDelivery(within(t, 10*time.Second), "broken", e.ID)
	var pe *PoisonedError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "broken", pe.Subscriber)
	require.Contains(t, pe.LastError, "never")

	note := b.record(t, Event{Type: "note.changed"})[0]
	rcpt, err = a.AwaitDelivery(within(t, 10*time.Second), "flaky", note.ID)
	require.NoError(t, err, "flaky does not take notes: nothing to wait for")
	require.NotContains(t, rcpt[0].Fanout, "flaky")
}

// Backfill of 10,000 retained events to a new subscriber while writes go
// on and relays fan out: every matching event created since the time
// reaches it exactly once, including those it already had from its own
// relay's stamps (never a second time), and none before the time; a second
// Backfill owes nothing more.
func TestBackfillOwesEachMatchingEventOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	old := setup(t, setupOpts{config: &RelayConfig{BatchSize: 500}}, mapSub("x", false, "**"))
	old.start(t)
	before := old.record(t, Event{Type: "order.placed"})[0]
	waitFannedOut(t, old.pool, 10*time.Second)
	since := time.Now()
	for range 20 {
		es := make([]Event, 500)
		for i := range es {
			es[i] = Event{Type: []string{"order.placed", "note.changed"}[i%2]}
		}
		old.record(t, es...)
	}
	waitFannedOut(t, old.pool, 60*time.Second)

	// The new subscriber's relay starts: from now on stamps reach it.
	newer := setup(t, setupOpts{url: old.url, config: &RelayConfig{BatchSize: 500}}, mapSub("x", false, "**"), mapSub("y", false, "order.*"))
	newer.start(t)
	stop := make(chan struct{})
	var writers sync.WaitGroup
	writers.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := pgx.BeginFunc(ctx, old.pool, func(tx pgx.Tx) error {
				_, err := RecordMany(ctx, tx, []Event{{Type: "order.placed"}, {Type: "note.changed"}})
				return err
			}); err != nil {
				t.Errorf("recording: %v", err)
				return
			}
		}
	})
	res, err := outbox.Backfill(ctx, old.pool, "y", since)
	close(stop)
	writers.Wait()
	require.NoError(t, err)
	require.GreaterOrEqual(t, res.Owed, int64(5000), "the 5,000 order events recorded before y existed")
	waitDelivered(t, old.pool, 60*time.Second)

	again, err := outbox.Backfill(ctx, old.pool, "y", since)
	require.NoError(t, err)
	require.Zero(t, again.Owed, "nothing more to owe")
	_, err = outbox.Backfill(ctx, old.pool, "nobody", since)
	require.ErrorIs(t, err, ErrUnknownSubscriber)
	subs, err := outbox.ListSubscribers(ctx, old.pool)
	require.NoError(t, err)
	require.Equal(t, "y", subs[1].Name)
	require.False(t, subs[1].BackfillDoneAt.IsZero(), "progress is visible")

	rows := loadRows(t, old.pool)
	perEvent := map[uuid.UUID]int{}
	for _, j := range loadJobs(t, old.pool) {
		if j.Subscriber == "y" {
			perEvent[j.EventID]++
		}
	}
	orders := 0
	for id, r := range rows {
		if r.Type != "order.placed" || id == before.ID {
			require.Zero(t, perEvent[id], "event %s (%s) is not y's", id, r.Type)
			continue
		}
		orders++
		require.Equal(t, 1, perEvent[id], "event %s: y's jobs", id)
		require.NotZero(t, r.Fanout["y"])
	}
	require.Greater(t, orders, 5000)
	require.Len(t, perEvent, orders)
}

// HandleTx: the handler's writes and its job's completion commit together.
// 200 events, the handler failing or panicking after its write now and then:
// every event's effect exists exactly once, and every job is completed.
func TestHandleTxCommitsEffectAndCompletionTogether(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var attempts atomic.Int32
	sub := Subscriber{Name: "ledger", Types: []string{"**"}, InsertOpts: &river.InsertOpts{MaxAttempts: 50},
		HandleTx: func(ctx context.Context, tx pgx.Tx, e Event) error {
			n := attempts.Add(1)
			if _, err := tx.Exec(ctx, "INSERT INTO handled (event_id) VALUES ($1)", e.ID); err != nil {
				return err
			}
			switch n % 7 {
			case 1:
				return errors.New("downstream said no, after the write")
			case 3:
				panic("handler bug, after the write")
			}
			return nil
		}}
	b := setup(t, setupOpts{work: true, retryPolicy: immediateRetry{}}, sub)
	exec(t, b.pool, "CREATE TABLE handled (event_id uuid NOT NULL)")
	b.start(t)
	es := make([]Event, 200)
	for i := range es {
		es[i] = Event{Type: "entry.posted"}
	}
	es = b.record(t, es...)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE kind = 'events.handle' AND state = 'completed'").Scan(&n))
		return n == 200
	}, 60*time.Second, 20*time.Millisecond, "every handler job completes")
	require.Greater(t, attempts.Load(), int32(200), "some attempts failed after writing")
	rows, err := b.pool.Query(ctx, "SELECT event_id, count(*) FROM handled GROUP BY event_id")
	require.NoError(t, err)
	effects := map[uuid.UUID]int{}
	for rows.Next() {
		var (
			id uuid.UUID
			n  int
		)
		require.NoError(t, rows.Scan(&id, &n))
		effects[id] = n
	}
	require.NoError(t, rows.Err())
	require.Len(t, effects, 200)
	for _, e := range es {
		require.Equal(t, 1, effects[e.ID], "event %s: its effect, once", e.ID)
	}
	_, err = newSubscription(Subscriber{Name: "x", Types: []string{"a"}, Handle: func(context.Context, Event) error { return nil },
		HandleTx: func(context.Context, pgx.Tx, Event) error { return nil }})
	require.ErrorIs(t, err, ErrInvalidSubscriber)
}

// handleTxChildEnv names the database a HandleTx worker child process works
// on; see TestHandleTxWorkerProcess.
const handleTxChildEnv = "EVENTS_HANDLETX_CHILD_URL"

// handleTxSubscriber writes one effect row per attempt and lingers a little
// before its transaction commits, widening the window a kill can land in.
func handleTxSubscriber() Subscriber {
	return Subscriber{Name: "ledger", Types: []string{"**"}, InsertOpts: &river.InsertOpts{MaxAttempts: 100},
		HandleTx: func(ctx context.Context, tx pgx.Tx, e Event) error {
			if _, err := tx.Exec(ctx, "INSERT INTO handled (event_id) VALUES ($1)", e.ID); err != nil {
				return err
			}
			time.Sleep(time.Duration(10+e.Seq%20) * time.Millisecond)
			return nil
		}}
}

// TestHandleTxWorkerProcess is not a test of its own: run by
// TestHandleTxEffectsExactlyOnceThroughKills as a child process, it works
// handler jobs until it is killed.
func TestHandleTxWorkerProcess(t *testing.T) {
	url := os.Getenv(handleTxChildEnv)
	if url == "" {
		return // only as a child process
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	relay, err := NewRelay(pool, &RelayConfig{Logger: quietLogger()})
	require.NoError(t, err)
	require.NoError(t, relay.Subscribe(handleTxSubscriber()))
	workers := river.NewWorkers()
	require.NoError(t, relay.AddWorkers(workers))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quietLogger(), Workers: workers,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 8}},
		FetchPollInterval: 20 * time.Millisecond, FetchCooldown: 5 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	select {} // until killed
}

// HandleTx: 200 events whose handler jobs are worked by a child process that
// is SIGKILLed at random and restarted: each handler effect exists if and
// only if its job completed, and exactly once. (A handler that committed its
// writes and left the completion to River would run again after a kill
// between the two, and write twice.)
func TestHandleTxEffectsExactlyOnceThroughKills(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{}, handleTxSubscriber())
	exec(t, b.pool, "CREATE TABLE handled (event_id uuid NOT NULL)")
	b.start(t)
	es := make([]Event, 200)
	for i := range es {
		es[i] = Event{Type: "entry.posted"}
	}
	es = b.record(t, es...)
	waitFannedOut(t, b.pool, 10*time.Second)
	completed := func() int {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE kind = 'events.handle' AND state = 'completed'").Scan(&n))
		return n
	}
	kills := 0
	deadline := time.Now().Add(90 * time.Second)
	for completed() < 200 {
		require.True(t, time.Now().Before(deadline), "the handler jobs never all completed (%d kills)", kills)
		cmd := osexec.Command(os.Args[0], "-test.run=^TestHandleTxWorkerProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), handleTxChildEnv+"="+b.url)
		require.NoError(t, cmd.Start())
		lifetime := time.Duration(100+int(time.Now().UnixNano()%300)) * time.Millisecond
		if kills >= 8 {
			lifetime = 3 * time.Second // let it finish
		}
		time.Sleep(lifetime) // a random moment to kill at, not a stand-in for a condition
		require.NoError(t, cmd.Process.Kill())
		_ = cmd.Wait()
		kills++
		// What River's rescuer does, after RescueStuckJobsAfter, to jobs a
		// dead process left running: they run again.
		exec(t, b.pool, "UPDATE river_job SET state = 'available', attempted_by = NULL WHERE state = 'running' AND kind = 'events.handle'")
	}
	rows, err := b.pool.Query(ctx, "SELECT event_id, count(*) FROM handled GROUP BY event_id")
	require.NoError(t, err)
	effects := map[uuid.UUID]int{}
	for rows.Next() {
		var (
			id uuid.UUID
			n  int
		)
		require.NoError(t, rows.Scan(&id, &n))
		effects[id] = n
	}
	require.NoError(t, rows.Err())
	for _, e := range es {
		require.Equal(t, 1, effects[e.ID], "event %s: its effect, once (%d kills)", e.ID, kills)
	}
	t.Logf("%d kills", kills)
}
