package events

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/standmeet/events/internal/engine"
	"github.com/standmeet/events/internal/testdb"
)

func TestMain(m *testing.M) {
	code := testdb.Main(m, func(ctx context.Context, pool *pgxpool.Pool) error {
		return outbox.Migrate(ctx, pool)
	})
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "leaked goroutines:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// testBundle is what a relay test works with.
type testBundle struct {
	url    string
	pool   *pgxpool.Pool
	client *river.Client[pgx.Tx]
	relay  *Relay
	idle   chan struct{} // receives each time the relay goes idle
}

// setupOpts shapes setup; the zero value is an insert-only River client.
type setupOpts struct {
	config *RelayConfig
	url    string        // an existing database (another "process"); default: a new one
	pool   *pgxpool.Pool // the relay's pool, on url; default: a new one
	// work makes the River client work jobs (handler subscribers, the sweep).
	work         bool
	periodicJobs []*river.PeriodicJob
	workers      func(*river.Workers)
	retryPolicy  river.ClientRetryPolicy
}

// setup builds a relay with subs on its own database (or opts.url), a River
// client and a pool; it does not start the relay. Everything stops when t ends.
func setup(t *testing.T, opts setupOpts, subs ...Subscriber) *testBundle {
	t.Helper()
	b := &testBundle{url: opts.url, idle: make(chan struct{}, 1)}
	if b.url == "" {
		b.url = testdb.URL(t)
	}
	b.pool = opts.pool
	if b.pool == nil {
		b.pool = testdb.Pool(t, b.url)
	}
	cfg := opts.config
	if cfg == nil {
		cfg = &RelayConfig{}
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	relay, err := NewRelay(b.pool, cfg)
	require.NoError(t, err)
	relay.eng.Hooks.Idle = func() {
		select {
		case b.idle <- struct{}{}:
		default:
		}
	}
	for _, s := range subs {
		require.NoError(t, relay.Subscribe(s))
	}
	riverCfg := &river.Config{PeriodicJobs: opts.periodicJobs, Logger: quietLogger(), RetryPolicy: opts.retryPolicy}
	if opts.work {
		workers := river.NewWorkers()
		require.NoError(t, relay.AddWorkers(workers))
		river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[testArgs]) error { return nil }))
		if opts.workers != nil {
			opts.workers(workers)
		}
		riverCfg.Workers = workers
		riverCfg.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}}
		riverCfg.FetchPollInterval = 50 * time.Millisecond
		riverCfg.FetchCooldown = 10 * time.Millisecond
	}
	b.client, err = river.NewClient(riverpgxv5.New(b.pool), riverCfg)
	require.NoError(t, err)
	if opts.work {
		require.NoError(t, b.client.Start(context.Background()))
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, b.client.Stop(ctx))
		})
	}
	b.relay = relay
	return b
}

// start starts the relay and stops it when t ends.
func (b *testBundle) start(t *testing.T) {
	t.Helper()
	require.NoError(t, b.relay.Start(context.Background(), b.client))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, b.relay.Stop(ctx))
	})
}

// waitIdle waits until the relay has nothing left to do and waits for work.
func (b *testBundle) waitIdle(t *testing.T) {
	t.Helper()
	select {
	case <-b.idle:
	case <-time.After(30 * time.Second):
		t.Fatal("relay never went idle")
	}
}

// settle waits until the relay is ready (it listens, and a round begun
// after that has finished), and then idle: from then on it claims rows on a
// notification, a retry timer, or a look for rows (after activity it looks
// again for about a second; see quiesce).
func (b *testBundle) settle(t *testing.T) {
	t.Helper()
	select {
	case <-b.relay.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("the relay never got ready")
	}
	select {
	case <-b.idle: // perhaps from before that round
	default:
	}
	b.waitIdle(t)
}

// quiesce settles the relay and waits out its re-checks after activity:
// from then on only a notification, a retry timer or the next poll makes it
// look.
func (b *testBundle) quiesce(t *testing.T) {
	t.Helper()
	b.settle(t)
	b.rechecksOver(t)
}

// rechecksOver waits until the relay has gone engine.LastRecheck and more without
// going idle: its re-checks after activity (about a second, see
// firstRecheck) are over. Unlike waitIdle it returns at once (after that
// wait) when the relay is idle already.
func (b *testBundle) rechecksOver(t *testing.T) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case <-b.idle:
		case <-time.After(engine.LastRecheck + 200*time.Millisecond):
			return
		case <-deadline:
			t.Fatal("the relay never stopped re-checking")
		}
	}
}

// holdAPendingRow inserts a pending row without a notification and locks it
// from another transaction until t ends, as a round in flight would hold
// it: every look the relay takes sees it, and every claim skips it.
func holdAPendingRow(t *testing.T, b *testBundle) {
	t.Helper()
	ctx := context.Background()
	held := uuid.Must(uuid.NewV7())
	exec(t, b.pool, "INSERT INTO outbox_events (id, type) VALUES ($1, 'held')", held)
	locker, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Rollback(context.Background()) })
	_, err = locker.Exec(ctx, "SELECT 1 FROM outbox_events WHERE id = $1 FOR UPDATE", held)
	require.NoError(t, err)
}

// record records es in one committed transaction.
func (b *testBundle) record(t *testing.T, es ...Event) []Event {
	t.Helper()
	var out []Event
	require.NoError(t, pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		var err error
		out, err = RecordMany(context.Background(), tx, es)
		return err
	}))
	return out
}

// outbox is the zero Outbox: the tables on the search_path, as a host with
// no schema of its own has them.
var outbox Outbox

// eventRow is an outbox row as tests see it.
type eventRow struct {
	Event
	FannedOut bool
	Fanout    map[string]int64
	Attempts  int
	LastError *string
	Poisoned  bool
}

func loadRows(t *testing.T, pool *pgxpool.Pool) map[uuid.UUID]eventRow {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT seq, id, type, subject, scope, payload, created_at,
		fanned_out_at IS NOT NULL, fanout, attempts, last_error, poisoned_at IS NOT NULL FROM outbox_events`)
	require.NoError(t, err)
	out := map[uuid.UUID]eventRow{}
	for rows.Next() {
		var r eventRow
		require.NoError(t, rows.Scan(&r.Seq, &r.ID, &r.Type, &r.Subject, &r.Scope, &r.Payload, &r.CreatedAt,
			&r.FannedOut, &r.Fanout, &r.Attempts, &r.LastError, &r.Poisoned))
		out[r.ID] = r
	}
	require.NoError(t, rows.Err())
	return out
}

// jobRow is a River job as tests see it.
type jobRow struct {
	ID         int64
	Subscriber string
	EventID    uuid.UUID
}

// loadJobs reads the relay's jobs: the subscriber from the relay's tag, the
// event from the args (testArgs.EventID, or HandleArgs.Event.ID).
func loadJobs(t *testing.T, pool *pgxpool.Pool) map[int64]jobRow {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id, tags,
		coalesce(args->>'event_id', args->'event'->>'id', '00000000-0000-0000-0000-000000000000')
		FROM river_job`)
	require.NoError(t, err)
	out := map[int64]jobRow{}
	for rows.Next() {
		var (
			j       jobRow
			tags    []string
			eventID string
		)
		require.NoError(t, rows.Scan(&j.ID, &tags, &eventID))
		for _, tag := range tags {
			if name, ok := strings.CutPrefix(tag, engine.TagSubscriber); ok {
				j.Subscriber = name
			}
		}
		j.EventID = uuid.MustParse(eventID)
		out[j.ID] = j
	}
	require.NoError(t, rows.Err())
	return out
}

// waitFannedOut waits until every event in the database is fanned out or
// poisoned.
func waitFannedOut(t *testing.T, pool *pgxpool.Pool, timeout time.Duration) {
	t.Helper()
	var pending int
	require.Eventually(t, func() bool {
		err := pool.QueryRow(context.Background(),
			"SELECT count(*) FROM outbox_events WHERE fanned_out_at IS NULL AND poisoned_at IS NULL").Scan(&pending)
		return err == nil && pending == 0
	}, timeout, 10*time.Millisecond, "events still pending")
}

// testArgs is a host's own job args for Map subscribers.
type testArgs struct {
	EventID uuid.UUID `json:"event_id"`
	Subject string    `json:"subject"`
}

func (testArgs) Kind() string { return "test.job" }

// mapSub is a Map subscriber that maps every event to testArgs.
func mapSub(name string, coalesce bool, types ...string) Subscriber {
	return Subscriber{Name: name, Types: types, Coalesce: coalesce,
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			return testArgs{EventID: e.ID, Subject: e.Subject}, nil, nil
		}}
}

// pairRow is an owed or poisoned (event, subscriber) pair as tests see it.
type pairRow struct {
	Attempts  int
	LastError string
	Errors    int // entries in the error history
	Poisoned  bool
}

// loadPairs reads outbox_deliveries: event ID -> subscriber -> pair.
func loadPairs(t *testing.T, pool *pgxpool.Pool) map[uuid.UUID]map[string]pairRow {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT e.id, d.subscriber, d.attempts, coalesce(d.last_error, ''),
		jsonb_array_length(d.errors), d.poisoned_at IS NOT NULL
		FROM outbox_deliveries d JOIN outbox_events e ON e.seq = d.event_seq`)
	require.NoError(t, err)
	out := map[uuid.UUID]map[string]pairRow{}
	for rows.Next() {
		var (
			id  uuid.UUID
			sub string
			p   pairRow
		)
		require.NoError(t, rows.Scan(&id, &sub, &p.Attempts, &p.LastError, &p.Errors, &p.Poisoned))
		if out[id] == nil {
			out[id] = map[string]pairRow{}
		}
		out[id][sub] = p
	}
	require.NoError(t, rows.Err())
	return out
}

// owedCount counts what is still to be delivered: owed pairs not poisoned,
// and catch_up lists of 0.1.0's relays not yet converted.
func owedCount(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM outbox_deliveries WHERE poisoned_at IS NULL)
		      + (SELECT count(*) FROM outbox_events WHERE catch_up IS NOT NULL)`).Scan(&n))
	return n
}

// waitDelivered waits until every event is fanned out or poisoned and no
// pair is owed but not poisoned.
func waitDelivered(t *testing.T, pool *pgxpool.Pool, timeout time.Duration) {
	t.Helper()
	waitFannedOut(t, pool, timeout)
	require.Eventually(t, func() bool { return owedCount(t, pool) == 0 }, timeout, 10*time.Millisecond, "pairs still owed")
}
