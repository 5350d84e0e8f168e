package events

import (
	"context"
	"fmt"
	"sync"
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

// orderedNode is one "process" of an ordered test: a pool, a relay and a
// River client that works the relay's jobs, with OrderedMiddleware.
type orderedNode struct {
	pool   *pgxpool.Pool
	relay  *Relay
	client *river.Client[pgx.Tx]
	cancel context.CancelFunc
}

// nodeOpts shapes an orderedNode; the zero value works.
type nodeOpts struct {
	config     *Config
	maxWorkers int
	workers    func(*river.Workers)
	clientID   string
	middleware []rivertype.Middleware
	// noWork builds an insert-only client.
	noWork bool
}

// startNode starts a relay with subs and a working River client on url;
// both stop when t ends (unless stopped before).
func startNode(t *testing.T, url string, opts nodeOpts, subs ...Subscriber) *orderedNode {
	t.Helper()
	n := &orderedNode{pool: testdb.Pool(t, url)}
	cfg := opts.config
	if cfg == nil {
		cfg = &Config{}
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	relay, err := NewRelay(n.pool, cfg)
	require.NoError(t, err)
	for _, s := range subs {
		require.NoError(t, relay.Subscribe(s))
	}
	n.relay = relay
	n.client = newOrderedClient(t, n.pool, relay, opts)
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	require.NoError(t, relay.Start(ctx, n.client))
	t.Cleanup(func() { n.stop(t) })
	return n
}

// newOrderedClient builds and starts a River client for relay's jobs.
func newOrderedClient(t *testing.T, pool *pgxpool.Pool, relay *Relay, opts nodeOpts) *river.Client[pgx.Tx] {
	t.Helper()
	cfg := &river.Config{Logger: quietLogger(), ID: opts.clientID}
	if !opts.noWork {
		workers := river.NewWorkers()
		require.NoError(t, relay.AddWorkers(workers))
		if opts.workers != nil {
			opts.workers(workers)
		}
		cfg.Workers = workers
		cfg.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: max(opts.maxWorkers, 10)}}
		cfg.FetchCooldown = 5 * time.Millisecond
		cfg.FetchPollInterval = 100 * time.Millisecond
		cfg.RetryPolicy = immediateRetry{}
		cfg.Middleware = append([]rivertype.Middleware{&OrderedMiddleware{}}, opts.middleware...)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), cfg)
	require.NoError(t, err)
	if !opts.noWork {
		require.NoError(t, client.Start(context.Background()))
	}
	return client
}

func (n *orderedNode) stop(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, n.relay.Stop(ctx))
	n.cancel()
	if err := n.client.Stop(ctx); err != nil && !isNotStarted(err) {
		require.NoError(t, err)
	}
}

func isNotStarted(err error) bool {
	return err != nil && (err.Error() == "client not started" || err.Error() == "client not started or already stopped")
}

// recordEach records each event in a transaction of its own, in order.
func recordEach(t *testing.T, pool *pgxpool.Pool, es ...Event) []Event {
	t.Helper()
	out := make([]Event, len(es))
	for i, e := range es {
		require.NoError(t, pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
			var err error
			out[i], err = Record(context.Background(), tx, e)
			return err
		}))
	}
	return out
}

// runLog records handler runs in memory: per subject, the events in the
// order their runs began, and whether two runs of one subject overlapped.
type runLog struct {
	mu       sync.Mutex
	running  map[string]int
	order    map[string][]uuid.UUID
	overlaps []string
}

func newRunLog() *runLog {
	return &runLog{running: map[string]int{}, order: map[string][]uuid.UUID{}}
}

func (l *runLog) begin(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running[e.Subject]++
	if l.running[e.Subject] > 1 {
		l.overlaps = append(l.overlaps, fmt.Sprintf("%s: event %d began while another ran", e.Subject, e.Seq))
	}
}

func (l *runLog) end(e Event, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running[e.Subject]--
	if ok {
		l.order[e.Subject] = append(l.order[e.Subject], e.ID)
	}
}

func (l *runLog) handled(subject string) []uuid.UUID {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]uuid.UUID(nil), l.order[subject]...)
}

func ids(es []Event) []uuid.UUID {
	out := make([]uuid.UUID, len(es))
	for i, e := range es {
		out[i] = e.ID
	}
	return out
}

// A Handle subscriber that is Ordered gets one subject's events one at a
// time, in commit order, while another subject's run alongside.
func TestOrderedHandleRunsOneSubjectAtATimeInOrder(t *testing.T) {
	t.Parallel()
	log := newRunLog()
	sub := Subscriber{Name: "seq", Types: []string{"**"}, Ordered: true,
		Handle: func(ctx context.Context, e Event) error {
			log.begin(e)
			time.Sleep(2 * time.Millisecond)
			log.end(e, true)
			return nil
		}}
	url := testdb.URL(t)
	n := startNode(t, url, nodeOpts{maxWorkers: 20}, sub)
	var a, b []Event
	for i := range 40 {
		a = append(a, Event{Type: "x.changed", Subject: "a", Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))})
		b = append(b, Event{Type: "x.changed", Subject: "b"})
	}
	var wg sync.WaitGroup
	var ra, rb []Event
	wg.Go(func() { ra = recordEach(t, n.pool, a...) })
	wg.Go(func() { rb = recordEach(t, n.pool, b...) })
	wg.Wait()
	require.Eventually(t, func() bool { return len(log.handled("a")) == 40 && len(log.handled("b")) == 40 },
		30*time.Second, 10*time.Millisecond)
	require.Empty(t, log.overlaps)
	require.Equal(t, ids(ra), log.handled("a"))
	require.Equal(t, ids(rb), log.handled("b"))
	var chains int
	require.NoError(t, n.pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox_chains").Scan(&chains))
	require.Zero(t, chains, "finished chains leave no row")
}

// jobOf returns the River job of subscriber sub that carries event id
// (handler jobs carry their event), with its state and attempt.
func jobOf(t *testing.T, pool *pgxpool.Pool, sub string, id uuid.UUID) (jobID int64, state string, attempt int) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT id, state::text, attempt FROM river_job
		WHERE $1 = ANY(tags) AND args->'event'->>'id' = $2 ORDER BY id DESC LIMIT 1`, tagSubscriber+sub, id.String()).Scan(&jobID, &state, &attempt)
	if err == pgx.ErrNoRows {
		return 0, "", 0
	}
	require.NoError(t, err)
	return jobID, state, attempt
}

// gate holds handlers back until opened. A test opens its gates in a
// cleanup registered after its nodes' (cleanups run last in, first out),
// so that a failed test's handlers return and its clients stop.
type gate struct {
	c    chan struct{}
	once sync.Once
}

func newGate() *gate { return &gate{c: make(chan struct{})} }

func (g *gate) open() { g.once.Do(func() { close(g.c) }) }

// recv waits for ch to be closed (or to receive), failing after d.
func recv(t *testing.T, ch <-chan struct{}, d time.Duration, msg string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatal(msg)
	}
}

// recvErr receives an error from ch, failing after d.
func recvErr(t *testing.T, ch <-chan error, d time.Duration, msg string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(d):
		t.Fatal(msg)
		return nil
	}
}

// workDone is a test middleware that reports what Work returned for the
// jobs it is asked about.
type workDone struct {
	river.MiddlewareDefaults
	mu      sync.Mutex
	watched map[[2]int64]chan error // (job ID, attempt) -> receives Work's error
}

func (m *workDone) watch(jobID int64, attempt int) <-chan error {
	m.mu.Lock()
	defer m.mu.Unlock()
	ch := make(chan error, 1)
	m.watched[[2]int64{jobID, int64(attempt)}] = ch
	return ch
}

func (m *workDone) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	err := doInner(ctx)
	m.mu.Lock()
	ch := m.watched[[2]int64{job.ID, int64(job.Attempt)}]
	m.mu.Unlock()
	if ch != nil {
		ch <- err
	}
	return err
}

// The zombie: a worker hangs in a HandleTx handler and River's rescuer gives
// its job to another worker (here the rescuer's UPDATE, as
// TestHandleTxEffectsExactlyOnceThroughKills does). The hung worker wakes
// and commits while the rescued run is still running: its completion is
// refused (fenced on the job's attempt) — its writes roll back, the chain
// does not move, the next job is not released — and it waits for the
// rescued run before it returns, so River records nothing against that run.
// The rescued run then completes the job and releases the next one, once.
func TestOrderedZombieCompletionIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var (
		mu          sync.Mutex
		runs        = map[uuid.UUID]int{}
		zombieHung  = make(chan struct{})
		zombieGo    = newGate()
		rescuedHung = make(chan struct{})
		rescuedGo   = newGate()
	)
	sub := Subscriber{Name: "ledger", Types: []string{"**"}, Ordered: true, InsertOpts: &river.InsertOpts{MaxAttempts: 5},
		HandleTx: func(ctx context.Context, tx pgx.Tx, e Event) error {
			mu.Lock()
			runs[e.ID]++
			run := runs[e.ID]
			mu.Unlock()
			if string(e.Payload) == `{"n": 1}` {
				switch run {
				case 1:
					close(zombieHung)
					<-zombieGo.c // a zombie ignores its context
				case 2:
					close(rescuedHung)
					<-rescuedGo.c
				}
			}
			_, err := tx.Exec(ctx, "INSERT INTO handled (event_id) VALUES ($1)", e.ID)
			return err
		}}
	url := testdb.URL(t)
	pool := testdb.Pool(t, url)
	exec(t, pool, "CREATE TABLE handled (event_id uuid NOT NULL)")
	done := &workDone{watched: map[[2]int64]chan error{}}
	startNode(t, url, nodeOpts{middleware: []rivertype.Middleware{done}}, sub)
	t.Cleanup(func() { zombieGo.open(); rescuedGo.open() })
	es := recordEach(t, pool, Event{Type: "a", Subject: "s", Payload: []byte(`{"n":1}`)}, Event{Type: "a", Subject: "s", Payload: []byte(`{"n":2}`)})
	recv(t, zombieHung, 20*time.Second, "the first run never started")
	first, state, attempt := jobOf(t, pool, "ledger", es[0].ID)
	require.Equal(t, "running", state)
	require.Equal(t, 1, attempt)
	require.Eventually(t, func() bool {
		_, state, _ := jobOf(t, pool, "ledger", es[1].ID)
		return state == "pending"
	}, 10*time.Second, 5*time.Millisecond, "the second event's job waits behind the first")
	zombie := done.watch(first, 1)

	// River's rescuer gives the job to another worker, which hangs too.
	exec(t, pool, "UPDATE river_job SET state = 'available', attempted_by = NULL WHERE id = $1 AND state = 'running'", first)
	recv(t, rescuedHung, 20*time.Second, "the rescued run never started")
	rescued := done.watch(first, 2)

	zombieGo.open() // the zombie commits while the rescued run runs
	select {
	case err := <-zombie:
		t.Fatalf("the zombie returned (%v) before the run that superseded it finished", err)
	case <-time.After(300 * time.Millisecond): // it waits: a bounded look, not a stand-in for a condition
	}
	_, state, _ = jobOf(t, pool, "ledger", es[1].ID)
	require.Equal(t, "pending", state, "the zombie released the next job while the rescued run of the first still ran")

	rescuedGo.open()
	require.NoError(t, recvErr(t, rescued, 20*time.Second, "the rescued run never returned"))
	var ref *chainRefusal
	require.ErrorAs(t, recvErr(t, zombie, 20*time.Second, "the zombie never returned"), &ref)
	require.Equal(t, "fenced", ref.outcome)
	require.Eventually(t, func() bool {
		_, state, _ := jobOf(t, pool, "ledger", es[1].ID)
		return state == "completed"
	}, 20*time.Second, 10*time.Millisecond, "the rescued run releases the next job, which completes")
	_, state, attempt = jobOf(t, pool, "ledger", es[0].ID)
	require.Equal(t, "completed", state, "the zombie's refusal did not disturb the job River completed")
	require.Equal(t, 2, attempt)

	counts := map[uuid.UUID]int{}
	rows, err := pool.Query(ctx, "SELECT event_id FROM handled")
	require.NoError(t, err)
	for rows.Next() {
		var id uuid.UUID
		require.NoError(t, rows.Scan(&id))
		counts[id]++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[uuid.UUID]int{es[0].ID: 1, es[1].ID: 1}, counts, "each effect once: the zombie's was refused")
	mu.Lock()
	require.Equal(t, 1, runs[es[1].ID], "the next job was released once")
	mu.Unlock()
}
