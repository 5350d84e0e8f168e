package events

import (
	"context"
	"errors"
	"os"
	osexec "os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

// A process that only works jobs registers the handlers with
// Outbox.AddWorkers, builds no relay, and works what another process's
// relay fanned out: Handle and HandleTx alike.
func TestAWorkerOnlyProcessWorksHandleJobsWithoutARelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var handled, handledTx atomic.Int32
	// The relay's process: it fans out, its River client works nothing.
	b := setup(t, setupOpts{},
		Subscriber{Name: "mail", Types: []string{"order.*"}, Handle: func(context.Context, Event) error { return nil }},
		Subscriber{Name: "ledger", Types: []string{"order.*"}, HandleTx: func(context.Context, pgx.Tx, Event) error { return nil }})
	b.start(t)

	// The worker's process: its own pool, the same subscribers with the
	// handlers that do the work, and no relay.
	pool := testdb.Pool(t, b.url)
	_, err := pool.Exec(ctx, "CREATE TABLE ledger (event_id uuid PRIMARY KEY)")
	require.NoError(t, err)
	workers := river.NewWorkers()
	require.NoError(t, outbox.AddWorkers(workers, pool,
		Subscriber{Name: "mail", Types: []string{"order.*"}, Handle: func(context.Context, Event) error {
			handled.Add(1)
			return nil
		}},
		Subscriber{Name: "ledger", Types: []string{"order.*"}, HandleTx: func(ctx context.Context, tx pgx.Tx, e Event) error {
			handledTx.Add(1)
			_, err := tx.Exec(ctx, "INSERT INTO ledger VALUES ($1)", e.ID)
			return err
		}}))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quietLogger(), Workers: workers,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}}, FetchPollInterval: 50 * time.Millisecond, FetchCooldown: 10 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() { require.NoError(t, client.Stop(context.WithoutCancel(ctx))) })

	var id any
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		e, err := Record(ctx, tx, Event{Type: "order.paid", Subject: "order:1"})
		id = e.ID
		return err
	}))
	require.Eventually(t, func() bool {
		var n int
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM ledger WHERE event_id = $1", id).Scan(&n)
		return handled.Load() == 1 && n == 1
	}, 20*time.Second, 10*time.Millisecond, "the worker-only process never handled the event")
	require.EqualValues(t, 1, handledTx.Load())
}

func TestAddWorkersRefusesWhatSubscribeRefuses(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t, testdb.URL(t))
	noop := func(context.Context, Event) error { return nil }
	for _, c := range []struct {
		subs  []Subscriber
		field string
	}{
		{[]Subscriber{{Name: "Has Space", Types: []string{"a"}, Handle: noop}}, "Name"},
		{[]Subscriber{{Name: "x", Handle: noop}}, "Types"},
		{[]Subscriber{{Name: "x", Types: []string{"a"}, Handle: noop}, {Name: "x", Types: []string{"b"}, Handle: noop}}, "Name"},
	} {
		err := outbox.AddWorkers(river.NewWorkers(), pool, c.subs...)
		var ve *ValidationError
		require.ErrorAs(t, err, &ve)
		require.ErrorIs(t, err, ErrInvalidSubscriber)
		require.Equal(t, c.field, ve.Field)
	}
	err := Outbox{Schema: "no-such"}.AddWorkers(river.NewWorkers(), pool)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorIs(t, outbox.AddWorkers(river.NewWorkers(), nil), ErrInvalidConfig)
}

// The schema is said on the Outbox; a River client of another schema would
// insert jobs where this outbox's workers never look, so Start refuses it.
func TestStartRefusesARiverClientOfAnotherSchema(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{config: &RelayConfig{Outbox: Outbox{Schema: "billing"}}})
	err := b.relay.Start(context.Background(), b.client)
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.Equal(t, "Outbox.Schema", ve.Field)
	require.Contains(t, err.Error(), `"billing"`)
	_, err = b.relay.FanoutTx(context.Background(), nil, b.client)
	require.ErrorIs(t, err, ErrInvalidConfig)
}

// An unordered HandleTx subscriber's effects happen once per event too: a
// run that outlives its rescue (it hung; River's rescuer gave the job to
// another worker, whose run committed) is fenced on its attempt, and its
// writes roll back. Before, only ordered jobs were fenced: the zombie's
// writes committed after the rescued run's, two rows for one event.
func TestHandleTxZombieOfAnUnorderedSubscriberIsFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var runs atomic.Int32
	zombieHung, zombieGo := make(chan struct{}), newGate()
	sub := Subscriber{Name: "ledger", Types: []string{"**"}, InsertOpts: &river.InsertOpts{MaxAttempts: 5},
		HandleTx: func(ctx context.Context, tx pgx.Tx, e Event) error {
			if runs.Add(1) == 1 {
				close(zombieHung)
				<-zombieGo.c // a zombie ignores its context
			}
			_, err := tx.Exec(ctx, "INSERT INTO handled (event_id) VALUES ($1)", e.ID)
			return err
		}}
	url := testdb.URL(t)
	pool := testdb.Pool(t, url)
	exec(t, pool, "CREATE TABLE handled (event_id uuid NOT NULL)")
	done := &workDone{watched: map[[2]int64]chan error{}}
	startNode(t, url, nodeOpts{middleware: []rivertype.Middleware{done}}, sub)
	t.Cleanup(zombieGo.open)
	e := recordEach(t, pool, Event{Type: "a", Subject: "s"})[0]
	recv(t, zombieHung, 20*time.Second, "the first run never started")
	job, state, _ := jobOf(t, pool, "ledger", e.ID)
	require.Equal(t, "running", state)
	zombie := done.watch(job, 1)

	// River's rescuer gives the job to another worker, whose run completes.
	exec(t, pool, "UPDATE river_job SET state = 'available', attempted_by = NULL WHERE id = $1 AND state = 'running'", job)
	require.Eventually(t, func() bool { _, state, _ := jobOf(t, pool, "ledger", e.ID); return state == "completed" },
		20*time.Second, 5*time.Millisecond, "the rescued run never completed")

	zombieGo.open() // the zombie commits after the rescued run did
	var ref *chainRefusal
	require.ErrorAs(t, recvErr(t, zombie, 20*time.Second, "the zombie never returned"), &ref)
	require.Equal(t, "fenced", ref.outcome)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM handled WHERE event_id = $1", e.ID).Scan(&n))
	require.Equal(t, 1, n, "the zombie's writes committed too")
	_, state, attempt := jobOf(t, pool, "ledger", e.ID)
	require.Equal(t, "completed", state, "the zombie's refusal disturbed the job River completed")
	require.Equal(t, 2, attempt)
}

// A process's River client works Handle jobs (left from an earlier run, say)
// while its relay's Start waits on the registry: the worker's lookup of the
// subscriber must not wait for Start.
func TestHandleJobsRunWhileTheRelayStartWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	handled := make(chan struct{}, 1)
	b := setup(t, setupOpts{work: true}, Subscriber{Name: "mail", Types: []string{"**"}, Handle: func(context.Context, Event) error {
		handled <- struct{}{}
		return nil
	}})
	locker, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer locker.Rollback(ctx)
	_, err = locker.Exec(ctx, "LOCK TABLE outbox_subscribers IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	startCtx, cancelStart := context.WithCancel(ctx)
	defer cancelStart()
	started := make(chan error, 1)
	go func() { started <- b.relay.Start(startCtx, b.client) }()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'").Scan(&n))
		return n > 0
	}, 30*time.Second, 5*time.Millisecond, "Start never waited on the registry")

	_, err = b.client.Insert(ctx, HandleArgs{Subscriber: "mail", Event: Event{Type: "a"}}, nil)
	require.NoError(t, err)
	select {
	case <-handled:
	case <-time.After(30 * time.Second):
		t.Error("the Handle job waited for the relay's Start")
	}
	cancelStart()
	require.Error(t, <-started)
}

// A process that registers its Handle subscribers both on its relay and with
// Outbox.AddWorkers, into the same river.Workers, is told what to do: River
// takes one worker per kind, so the second set would never be looked up.
func TestAddWorkersTwiceSaysWhy(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, Subscriber{Name: "mail", Types: []string{"**"}, Handle: func(context.Context, Event) error { return nil }})
	workers := river.NewWorkers()
	require.NoError(t, b.relay.AddWorkers(workers))
	err := outbox.AddWorkers(workers, b.pool, Subscriber{Name: "ledger", Types: []string{"**"}, Handle: func(context.Context, Event) error { return nil }})
	require.Error(t, err)
	require.Contains(t, err.Error(), `"events.handle"`)
	require.Contains(t, err.Error(), "Relay.AddWorkers")
	require.Contains(t, err.Error(), "Outbox.AddWorkers")
}

// A worker-only process whose Outbox names another schema than its River
// client (nothing checks them against each other there: no relay) must not
// take a job of a subscriber it does not know for retired — the registry it
// would read is not the one the job's relay wrote — and cancel it for good
// during a rolling deploy. The job fails, saying why, and is retried.
func TestAWorkerOfAnotherSchemaThanItsClientCancelsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.URL(t)) // the search_path's outbox is migrated too
	billing := Outbox{Schema: "billing"}
	require.NoError(t, billing.Migrate(ctx, pool))
	// The relay's process, in billing, registers "mail".
	relay, err := NewRelay(pool, &RelayConfig{Outbox: billing, Logger: quietLogger()})
	require.NoError(t, err)
	require.NoError(t, relay.Subscribe(Subscriber{Name: "mail", Types: []string{"**"}, Handle: func(context.Context, Event) error { return nil }}))
	inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: "billing", Logger: quietLogger()})
	require.NoError(t, err)
	require.NoError(t, relay.Start(ctx, inserter))
	require.NoError(t, relay.Stop(ctx))

	// The worker's process: an older release that does not know "mail", its
	// Outbox left at the zero value while its River client works billing.
	workers := river.NewWorkers()
	require.NoError(t, Outbox{}.AddWorkers(workers, pool))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: "billing", Logger: quietLogger(), Workers: workers,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}}, FetchPollInterval: 50 * time.Millisecond, FetchCooldown: 10 * time.Millisecond})
	require.NoError(t, err)
	res, err := inserter.Insert(ctx, HandleArgs{Subscriber: "mail", Event: Event{Type: "a"}}, nil)
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() { require.NoError(t, client.Stop(context.WithoutCancel(ctx))) })

	var state string
	require.Eventually(t, func() bool {
		var attempted bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT state::text, attempted_at IS NOT NULL FROM billing.river_job WHERE id = $1", res.Job.ID).Scan(&state, &attempted))
		return attempted && state != "running"
	}, 30*time.Second, 10*time.Millisecond)
	require.NotEqual(t, "cancelled", state, "the job of a live subscriber was cancelled for good")
	var errs []byte
	require.NoError(t, pool.QueryRow(ctx, "SELECT coalesce(errors::text, '') FROM billing.river_job WHERE id = $1", res.Job.ID).Scan(&errs))
	require.Contains(t, string(errs), "schema", "the failure names the mismatch")
}

// Jobs of a Handle subscriber that no process knows end cleanly: cancelled
// once it is retired, snoozed (not failed, not retried for days) while it is
// active, since another release may know it.
func TestHandleJobsOfAnUnknownSubscriber(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{work: true})
	_, err := registerSubscribers(ctx, b.pool, defaultSQL(t), []string{"active-elsewhere", "removed"})
	require.NoError(t, err)
	require.NoError(t, outbox.RetireSubscriber(ctx, b.pool, "removed"))
	var ids [2]int64
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		for i, name := range []string{"active-elsewhere", "removed"} {
			res, err := b.client.InsertTx(ctx, tx, HandleArgs{Subscriber: name, Event: Event{ID: uuid.Must(uuid.NewV7()), Type: "a"}}, nil)
			if err != nil {
				return err
			}
			ids[i] = res.Job.ID
		}
		return nil
	}))
	state := func(id int64) (string, int) {
		var s string
		var attempt int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT state, attempt FROM river_job WHERE id = $1", id).Scan(&s, &attempt))
		return s, attempt
	}
	require.Eventually(t, func() bool { s, _ := state(ids[1]); return s == "cancelled" }, 30*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { s, _ := state(ids[0]); return s == "scheduled" }, 30*time.Second, 10*time.Millisecond)
	var snoozes int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT coalesce((metadata->>'snoozes')::int, 0) FROM river_job WHERE id = $1", ids[0]).Scan(&snoozes))
	require.Equal(t, 1, snoozes, "snoozed, not failed")
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

// An unordered HandleTx handler's transaction keeps the database's
// default isolation (only ordered completions, which lock a chain's row,
// run at READ COMMITTED): a host whose default is SERIALIZABLE keeps its
// protection from lost updates. Two handlers read a balance and write it
// back; one fails with 40001 and River retries it.
func TestUnorderedHandleTxKeepsTheDatabaseIsolation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	pool := testdb.Pool(t, url)
	var db string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_database()").Scan(&db))
	exec(t, pool, "CREATE TABLE handletx_balance (id int PRIMARY KEY, n int NOT NULL); INSERT INTO handletx_balance VALUES (1, 0)")
	exec(t, pool, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET default_transaction_isolation = 'serializable'")
	pool = testdb.Pool(t, url)
	var (
		arrived    atomic.Int32
		isolations sync.Map // the handlers' transactions' isolation levels
	)
	both := newGate()
	t.Cleanup(both.open)
	sub := Subscriber{Name: "ledger", Types: []string{"**"},
		HandleTx: func(ctx context.Context, tx pgx.Tx, e Event) error {
			var (
				n         int
				isolation string
			)
			if err := tx.QueryRow(ctx, "SELECT n, current_setting('transaction_isolation') FROM handletx_balance WHERE id = 1").Scan(&n, &isolation); err != nil {
				return err
			}
			isolations.Store(isolation, true)
			if arrived.Add(1) <= 2 {
				if arrived.Load() == 2 {
					both.open()
				}
				<-both.c // both first runs have read the balance
			}
			_, err := tx.Exec(ctx, "UPDATE handletx_balance SET n = $1 WHERE id = 1", n+1)
			return err
		}}
	startNode(t, url, nodeOpts{}, sub)
	recordEach(t, pool, Event{Type: "x"}, Event{Type: "x"})
	require.True(t, holdsWithin(30*time.Second, func() bool {
		// One statement: counted apart, the relay's jobs could land between
		// a count of none left and a count of two in all.
		var total, left int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE state <> 'completed') FROM river_job").Scan(&total, &left))
		return total == 2 && left == 0
	}), "the jobs never completed")
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT n FROM handletx_balance WHERE id = 1").Scan(&n))
	var levels []string
	isolations.Range(func(k, _ any) bool { levels = append(levels, k.(string)); return true })
	require.Equal(t, []string{"serializable"}, levels, "the handlers' transactions")
	require.Equal(t, 2, n, "two handlers each added one; an update was lost")
}
