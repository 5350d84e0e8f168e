package events

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
	_, err = b.relay.FanOutTx(context.Background(), nil, b.client)
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
