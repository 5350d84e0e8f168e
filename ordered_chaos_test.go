package events

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	osexec "os/exec"
	"sort"
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
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

// The ordered chaos checker. Producers serialise their writes per subject
// (lock the subject's row, count, record, commit) over hot and cold
// subjects; three relays with three River clients (each its own pool) and a
// child worker process fan out and work two ordered subscribers — "ledger"
// (HandleTx, blocks on a discarded head) and "feed" (Map through
// OrderedMiddleware, continues past one) — whose handlers fail at random.
// Relays are stopped abruptly, clients stopped with their jobs cancelled,
// connections terminated, the child SIGKILLed (the other relays see its
// relay fall silent and give back the heads it ran: the library's
// dead-worker rescue, nothing hand-made), and some ledger handlers hang until
// River's rescuer has given their job to another worker: zombies. An
// operator resumes or skips blocked subjects. Every handler run is logged
// in the database (its start and end through a pool the chaos leaves alone;
// a ledger success commits its own interval inside the handler's
// transaction). Then the checker reads the logs:
//
//   - within each (subscriber, subject) no two runs overlap, unless one of
//     them is a run whose commit did not happen (a fenced zombie, a run
//     killed with its process or cancelled with its client);
//   - the committed runs of each (subscriber, subject) follow commit order;
//   - each event ends handled once, or skipped (given up by the operator,
//     or discarded under OrderedContinue), and nothing is left blocked;
//   - at least one zombie was refused; and runs of different subjects did
//     overlap.
func TestOrderedChaosChecker(t *testing.T) {
	t.Parallel()
	events, duration := 800, 10*time.Second
	if testing.Short() {
		events, duration = 300, 5*time.Second
	}
	c := newOrderedChaos(t)
	c.run(events, duration)
	c.check()
}

// orderedChildEnv names the database and the client ID of an ordered worker
// child process; see TestOrderedWorkerProcess.
const (
	orderedChildURLEnv = "EVENTS_ORDERED_CHILD_URL"
	orderedChildIDEnv  = "EVENTS_ORDERED_CHILD_ID"
)

// TestOrderedWorkerProcess is not a test of its own: run by
// TestOrderedChaosChecker as a child process, it works the checker's jobs
// until it is killed.
func TestOrderedWorkerProcess(t *testing.T) {
	url := os.Getenv(orderedChildURLEnv)
	if url == "" {
		return // only as a child process
	}
	ctx := context.Background()
	id := os.Getenv(orderedChildIDEnv)
	pool, err := pgxpool.New(ctx, withAppName(url, id))
	require.NoError(t, err)
	logPool, err := pgxpool.New(ctx, withAppName(url, chaosLogApp+"-"+id))
	require.NoError(t, err)
	h := &chaosHandlers{log: logPool, proc: id}
	// A relay of its own, as every process that works ordered jobs should
	// run: its heartbeat tells the others when the process is gone.
	relay, err := NewRelay(pool, &RelayConfig{Logger: quietLogger(), Outbox: Outbox{OrphanAfter: chaosOrphanAfter}})
	require.NoError(t, err)
	for _, s := range h.subscribers() {
		require.NoError(t, relay.Subscribe(s))
	}
	client := h.client(t, pool, relay, id)
	require.NoError(t, client.Start(ctx))
	require.NoError(t, relay.Start(ctx, client))
	select {} // until killed
}

// chaosJobTimeout is the clients' JobTimeout: the test's rescuer gives a
// hung run's job to another worker only after it, as River's does.
const chaosJobTimeout = 2 * time.Second

// chaosOrphanAfter makes every relay of the checker report in every
// 200 ms (OrphanAfter / 3), and chaosDeadWorkerAfter is how long a silent
// relay's River client must have been silent before the others give back
// the heads it ran: fifteen heartbeats, so a live process on a busy
// machine is not taken for dead, and a SIGKILLed child's heads run again
// within seconds.
const (
	chaosOrphanAfter     = 600 * time.Millisecond
	chaosDeadWorkerAfter = 3 * time.Second
)

// chaosLogApp starts the application_name of the log pools, which the
// chaos never terminates.
const chaosLogApp = "ordered-chaos-log"

func withAppName(url, app string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "application_name=" + app
}

// chaosArgs are feed's job args.
type chaosArgs struct {
	EventID uuid.UUID `json:"event_id"`
	Subject string    `json:"subject"`
	N       int       `json:"n"`
}

func (chaosArgs) Kind() string { return "test.ordered_feed" }

// chaosHandlers are the checker's subscribers' handlers, in the test process
// or in a child.
type chaosHandlers struct {
	log  *pgxpool.Pool
	proc string
	// zombie, when set (the test process), decides whether a run hangs as a
	// zombie, and hangs it.
	zombie func(ctx context.Context, job *rivertype.JobRow, e Event) bool
}

// fails decides, the same way in every process, whether an attempt fails:
// about one in four.
func fails(id uuid.UUID, attempt int) bool {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s/%d", id, attempt)))
	return sum[0]%4 == 0
}

func chaosN(e Event) int {
	var n int
	_, _ = fmt.Sscanf(string(e.Payload), `{"n": %d}`, &n)
	return n
}

// begin logs the start of a run and returns its log row's ID and time.
func (h *chaosHandlers) begin(ctx context.Context, sub string, job *rivertype.JobRow, e Event) (int64, time.Time, error) {
	var (
		id      int64
		started time.Time
	)
	err := h.log.QueryRow(context.WithoutCancel(ctx), `INSERT INTO chaos_runs (sub, subject, n, event_id, job_id, attempt, proc)
		VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id, started_at`, sub, e.Subject, chaosN(e), e.ID, job.ID, job.Attempt, h.proc).Scan(&id, &started)
	return id, started, err
}

func (h *chaosHandlers) end(ctx context.Context, run int64, outcome string) {
	_, _ = h.log.Exec(context.WithoutCancel(ctx), "UPDATE chaos_runs SET ended_at = clock_timestamp(), outcome = $2 WHERE id = $1", run, outcome)
}

// work is a run's body: a few milliseconds, unless the client stops.
func work(ctx context.Context) error {
	select {
	case <-time.After(time.Duration(1+rand.IntN(4)) * time.Millisecond):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *chaosHandlers) subscribers() []Subscriber {
	ledger := Subscriber{Name: "ledger", Types: []string{"**"}, Ordered: true, InsertOpts: &river.InsertOpts{MaxAttempts: 4},
		HandleTx: func(ctx context.Context, tx pgx.Tx, e Event) error {
			job := JobFromContext(ctx)
			run, started, err := h.begin(ctx, "ledger", job, e)
			if err != nil {
				return err
			}
			if h.zombie != nil && h.zombie(ctx, job, e) {
				// A stuck worker ignores its context to the end.
				ctx = context.WithoutCancel(ctx)
			}
			if err := work(ctx); err != nil {
				h.end(ctx, run, "cancelled")
				return err
			}
			if fails(e.ID, job.Attempt) {
				h.end(ctx, run, "error")
				return errors.New("ledger: random failure")
			}
			// The success commits with the job's completion, or not at all.
			if _, err := tx.Exec(ctx, `INSERT INTO chaos_done (run_id, event_id, subject, n, attempt, started_at, ended_at)
				VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp())`, run, e.ID, e.Subject, chaosN(e), job.Attempt, started); err != nil {
				h.end(ctx, run, "error")
				return err
			}
			h.end(ctx, run, "ok")
			return nil
		}}
	feed := Subscriber{Name: "feed", Types: []string{"**"}, Ordered: true, OrderedOnDiscard: OrderedContinue,
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			return chaosArgs{EventID: e.ID, Subject: e.Subject, N: chaosN(e)}, &river.InsertOpts{MaxAttempts: 2}, nil
		}}
	return []Subscriber{ledger, feed}
}

// feedWorker is the host's worker of feed's jobs.
func (h *chaosHandlers) feedWorker(ctx context.Context, job *river.Job[chaosArgs]) error {
	e := Event{ID: job.Args.EventID, Subject: job.Args.Subject, Payload: []byte(fmt.Sprintf(`{"n": %d}`, job.Args.N))}
	run, _, err := h.begin(ctx, "feed", job.JobRow, e)
	if err != nil {
		return err
	}
	if err := work(ctx); err != nil {
		h.end(ctx, run, "cancelled")
		return err
	}
	if fails(e.ID, job.Attempt) {
		h.end(ctx, run, "error")
		return errors.New("feed: random failure")
	}
	h.end(ctx, run, "ok")
	return nil
}

// client builds a River client that works the checker's jobs.
func (h *chaosHandlers) client(t testing.TB, pool *pgxpool.Pool, relay *Relay, id string) *river.Client[pgx.Tx] {
	workers := river.NewWorkers()
	require.NoError(t, relay.AddWorkers(workers))
	river.AddWorker(workers, river.WorkFunc(h.feedWorker))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		ID: id, Logger: quietLogger(), Workers: workers,
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 6}},
		FetchCooldown: 5 * time.Millisecond, FetchPollInterval: 100 * time.Millisecond,
		JobTimeout: chaosJobTimeout, RetryPolicy: immediateRetry{},
		Middleware: []rivertype.Middleware{&OrderedMiddleware{}},
	})
	require.NoError(t, err)
	return client
}

// chaosSlot is one in-process "process" of the checker.
type chaosSlot struct {
	index  int
	gen    int // how many clients it has had
	pool   *pgxpool.Pool
	relay  *Relay
	client *river.Client[pgx.Tx]
	id     string // the River client's ID
	cancel context.CancelFunc
}

type orderedChaos struct {
	t     *testing.T
	url   string
	admin *pgxpool.Pool
	h     *chaosHandlers
	slots []*chaosSlot

	// Zombies: jobs hung in a ledger run until River's rescuer gave them
	// to another worker; each is let go once another run of its job began.
	zmu     sync.Mutex
	zombies map[[2]int64]chan struct{} // (job, attempt) -> closed to let go
	hung    atomic.Int32

	// The child worker process and when each of its runs was killed.
	child       *osexec.Cmd
	childExited chan struct{} // closed once child has exited
	childID     string
	kids        atomic.Int32
	// killedAt is when each child was killed, by the database's clock: a
	// run's end logged later (a statement the server still ran after the
	// kill) is not when the run ended.
	killedAt map[string]time.Time
	// childHeld counts the jobs killed children left running.
	childHeld int

	// What the operator skipped, per (subscriber, subject): the head
	// events it gave up.
	smu     sync.Mutex
	skipped map[uuid.UUID]bool

	faults sync.Map // kind -> *atomic.Int32
}

func newOrderedChaos(t *testing.T) *orderedChaos {
	url := testdb.URL(t)
	c := &orderedChaos{t: t, url: url, admin: testdb.Pool(t, url), zombies: map[[2]int64]chan struct{}{}, skipped: map[uuid.UUID]bool{},
		killedAt: map[string]time.Time{}}
	exec(t, c.admin, "CREATE TABLE subjects (name text PRIMARY KEY, n integer NOT NULL DEFAULT 0)")
	exec(t, c.admin, `CREATE TABLE chaos_runs (id bigserial PRIMARY KEY, sub text NOT NULL, subject text NOT NULL, n int NOT NULL,
		event_id uuid NOT NULL, job_id bigint NOT NULL, attempt int NOT NULL, proc text NOT NULL,
		started_at timestamptz NOT NULL DEFAULT clock_timestamp(), ended_at timestamptz, outcome text)`)
	exec(t, c.admin, `CREATE TABLE chaos_done (run_id bigint NOT NULL, event_id uuid NOT NULL, subject text NOT NULL, n int NOT NULL,
		attempt int NOT NULL, started_at timestamptz NOT NULL, ended_at timestamptz NOT NULL)`)
	logPool, err := pgxpool.New(context.Background(), withAppName(url, chaosLogApp))
	require.NoError(t, err)
	t.Cleanup(logPool.Close)
	c.h = &chaosHandlers{log: logPool, proc: "test", zombie: c.maybeZombie}
	return c
}

func (c *orderedChaos) fault(kind string) {
	v, _ := c.faults.LoadOrStore(kind, new(atomic.Int32))
	v.(*atomic.Int32).Add(1)
}

// zombieRun says which ledger runs hang as zombies: the first attempt of
// some events of the hot subjects.
func zombieRun(subject string, n, attempt int) bool {
	return attempt == 1 && strings.HasPrefix(subject, "hot-") && n%25 == 7
}

// maybeZombie hangs a zombie run, ignoring the context, as a stuck worker
// does, until another run of the job has begun (or ten seconds passed),
// and reports whether it did.
func (c *orderedChaos) maybeZombie(_ context.Context, job *rivertype.JobRow, e Event) bool {
	if !zombieRun(e.Subject, chaosN(e), job.Attempt) {
		return false
	}
	ch := make(chan struct{})
	c.zmu.Lock()
	c.zombies[[2]int64{job.ID, int64(job.Attempt)}] = ch
	c.zmu.Unlock()
	c.hung.Add(1)
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
	}
	return true
}

// rescuer plays River's rescuer for the zombies: it gives a hung job to
// another worker, and lets the zombie go once another run of the job began.
func (c *orderedChaos) rescuer(stop <-chan struct{}) {
	ctx := context.Background()
	for {
		select {
		case <-stop:
			c.zmu.Lock()
			for k, ch := range c.zombies {
				close(ch)
				delete(c.zombies, k)
			}
			c.zmu.Unlock()
			return
		case <-time.After(20 * time.Millisecond):
		}
		c.zmu.Lock()
		for k, ch := range c.zombies {
			// Only once the run is older than the clients' JobTimeout, as
			// River's rescuer (RescueStuckJobsAfter is at least JobTimeout).
			_, _ = c.admin.Exec(ctx, `UPDATE river_job SET state = 'available', attempted_by = NULL
				WHERE id = $1 AND state = 'running' AND attempt = $2 AND attempted_at < now() - $3::bigint * interval '1 microsecond'`,
				k[0], k[1], (chaosJobTimeout + chaosJobTimeout/4).Microseconds())
			var later bool
			if err := c.admin.QueryRow(ctx, "SELECT attempt > $2 FROM river_job WHERE id = $1", k[0], k[1]).Scan(&later); err == nil && later {
				close(ch)
				delete(c.zombies, k)
				c.fault("zombie let go after its job was rescued")
			}
		}
		c.zmu.Unlock()
	}
}

func (c *orderedChaos) startSlot(s *chaosSlot) {
	t := c.t
	relay, err := NewRelay(s.pool, &RelayConfig{BatchSize: 1 + rand.IntN(40), RetryBackoff: 20 * time.Millisecond, MaxRetryBackoff: 200 * time.Millisecond,
		Listener: ListenerConfig{hooks: listenerHooks{reconnectBackoff: 20 * time.Millisecond, maxReconnectBackoff: 200 * time.Millisecond}}, Logger: quietLogger(),
		Outbox: Outbox{OrphanAfter: chaosOrphanAfter}})
	require.NoError(t, err)
	relay.eng.Hooks.DeadWorkerAfter = chaosDeadWorkerAfter
	for _, sub := range c.h.subscribers() {
		require.NoError(t, relay.Subscribe(sub))
	}
	s.relay = relay
	s.gen++
	s.id = fmt.Sprintf("ordered-slot-%d-%d", s.index, s.gen)
	s.client = c.h.client(t, s.pool, relay, s.id)
	require.NoError(t, s.client.Start(context.Background()))
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	require.NoError(t, relay.Start(ctx, s.client))
}

// stopSlot stops a slot: abruptly (the round in flight rolls back, the
// client's jobs are cancelled) or gracefully.
func (c *orderedChaos) stopSlot(s *chaosSlot, abrupt bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if abrupt {
		s.cancel()
		_ = s.relay.Stop(ctx)
		_ = s.client.StopAndCancel(ctx)
		// What River's rescuer does, after RescueStuckJobsAfter, to jobs a
		// stopped client left running (its last word lost with a connection
		// the chaos terminated, or a zombie still hung): they run again.
		c.rescue(s.id)
		return
	}
	_ = s.relay.Stop(ctx)
	s.cancel()
	_ = s.client.Stop(ctx)
}

// startChild starts the child worker process and waits until its relay has
// reported in. The faults come one at a time, and this wait keeps the next
// one (a terminated connection, above all) from landing while the child
// starts: a Start that fails ends the child, and nothing here starts it
// again (CI saw a child that never reported in). A child that never reports
// in fails the test with what it printed.
func (c *orderedChaos) startChild() {
	c.childID = fmt.Sprintf("ordered-child-%d", c.kids.Add(1))
	cmd := osexec.Command(os.Args[0], "-test.run=^TestOrderedWorkerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), orderedChildURLEnv+"="+c.url, orderedChildIDEnv+"="+c.childID)
	var out bytes.Buffer // read only once the child has exited
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(c.t, cmd.Start())
	c.child = cmd
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_ = cmd.Wait()
	}()
	c.childExited = exited
	deadline := time.Now().Add(2 * time.Minute) // a second or two when healthy
	for {
		var up bool
		require.NoError(c.t, c.admin.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM outbox_relays WHERE river_client_id = $1)`,
			c.childID).Scan(&up))
		if up {
			return
		}
		select {
		case <-exited:
			c.t.Fatalf("the child %s exited before its relay reported in:\n%s", c.childID, out.String())
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			c.t.Fatalf("the child %s's relay never reported in:\n%s", c.childID, out.String())
		}
	}
}

// killChild SIGKILLs the child; its unfinished runs end now. Nothing here
// gives its running jobs back: the relays do (a dead worker's heads,
// ChainRescue), after chaosDeadWorkerAfter, and River's rescuer would take
// an hour, longer than the run may take to settle.
func (c *orderedChaos) killChild() {
	// Its relay has reported in (startChild): the others see it go.
	require.NoError(c.t, c.child.Process.Kill())
	<-c.childExited
	// The server finishes a statement the child had sent (a fetch, a log
	// line) after the child died: wait for its backends to go first.
	require.Eventually(c.t, func() bool {
		var left int
		require.NoError(c.t, c.admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name IN ($1, $2)`, c.childID, chaosLogApp+"-"+c.childID).Scan(&left))
		return left == 0
	}, 20*time.Second, 5*time.Millisecond, "the killed child's backends linger")
	var at time.Time
	require.NoError(c.t, c.admin.QueryRow(context.Background(), "SELECT clock_timestamp()").Scan(&at))
	c.killedAt[c.childID] = at
	exec(c.t, c.admin, `UPDATE chaos_runs SET ended_at = clock_timestamp(), outcome = 'killed' WHERE proc = $1 AND ended_at IS NULL`, c.childID)
	var held int
	require.NoError(c.t, c.admin.QueryRow(context.Background(), `SELECT count(*) FROM river_job
		WHERE state = 'running' AND attempted_by[array_upper(attempted_by, 1)] = $1`, c.childID).Scan(&held))
	c.childHeld += held
}

// rescue makes the jobs that the River client id left running available
// again, as River's rescuer does.
func (c *orderedChaos) rescue(id string) {
	_, err := c.admin.Exec(context.Background(), `UPDATE river_job SET state = 'available', attempted_by = NULL
		WHERE state = 'running' AND attempted_by[array_upper(attempted_by, 1)] = $1`, id)
	require.NoError(c.t, err)
}

// operator resumes or skips the blocked subjects it finds, until stop:
// a head is resumed once, and skipped when it blocks again.
func (c *orderedChaos) operator(stop <-chan struct{}, every time.Duration) {
	ctx := context.Background()
	o := Outbox{}
	resumed := map[int64]bool{}
	for {
		select {
		case <-stop:
			return
		case <-time.After(every):
		}
		res, err := o.ListChains(ctx, c.admin, ListChainsParams{Blocked: true, Limit: 1000})
		if err != nil {
			continue
		}
		for _, ch := range res.Chains {
			if !resumed[ch.HeadJobID] && rand.IntN(2) == 0 {
				if o.ResumeChain(ctx, c.admin, ch.Subscriber, ch.Subject) == nil {
					resumed[ch.HeadJobID] = true
					c.fault("operator resumed a blocked subject")
				}
				continue
			}
			if o.SkipChain(ctx, c.admin, ch.Subscriber, ch.Subject) == nil {
				c.smu.Lock()
				c.skipped[ch.HeadEventID] = true
				c.smu.Unlock()
				c.fault("operator skipped a blocked head")
			}
		}
	}
}

// subjectOf picks a subject: three hot ones take most events.
func subjectOf(rng *rand.Rand) string {
	if rng.IntN(10) < 6 {
		return fmt.Sprintf("hot-%d", rng.IntN(3))
	}
	return fmt.Sprintf("cold-%d", rng.IntN(40))
}

func (c *orderedChaos) run(total int, duration time.Duration) {
	t := c.t
	ctx := context.Background()
	exec(t, c.admin, `INSERT INTO subjects (name) SELECT 'hot-' || g FROM generate_series(0, 2) g
		UNION ALL SELECT 'cold-' || g FROM generate_series(0, 39) g`)
	for i := range 3 {
		s := &chaosSlot{index: i, pool: testdb.Pool(t, c.url)}
		c.startSlot(s)
		c.slots = append(c.slots, s)
	}
	c.startChild()
	t.Cleanup(func() { // a failed run's leftovers
		if c.child != nil {
			_ = c.child.Process.Kill()
			<-c.childExited
		}
		for _, s := range c.slots {
			c.stopSlot(s, true)
		}
	})
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() { c.rescuer(stop) })
	bg.Go(func() { c.operator(stop, 300*time.Millisecond) })

	// Producers: serialised per subject by the subject's row lock, spread
	// over the run.
	var (
		next  atomic.Int64
		prods sync.WaitGroup
		pace  = duration / time.Duration(total/4+1)
	)
	producerPool := testdb.Pool(t, withAppName(c.url, chaosLogApp))
	for w := range 4 {
		prods.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 2323))
			for next.Add(1) <= int64(total) {
				subject := subjectOf(rng)
				err := pgx.BeginFunc(ctx, producerPool, func(tx pgx.Tx) error {
					var n int
					if err := tx.QueryRow(ctx, "UPDATE subjects SET n = n + 1 WHERE name = $1 RETURNING n", subject).Scan(&n); err != nil {
						return err
					}
					_, err := Record(ctx, tx, Event{Type: "chaos.changed", Subject: subject, Payload: []byte(fmt.Sprintf(`{"n": %d}`, n))})
					return err
				})
				if err != nil {
					t.Errorf("producing: %v", err)
					return
				}
				time.Sleep(pace) // spreads the events over the run: a pace, not a wait for a condition
			}
		})
	}

	// Chaos while the producers run.
	producing := make(chan struct{})
	go func() { prods.Wait(); close(producing) }()
	for done := false; !done; {
		select {
		case <-producing:
			done = true
			continue
		case <-time.After(time.Duration(150+rand.IntN(350)) * time.Millisecond):
		}
		switch rand.IntN(5) {
		case 0:
			s := c.slots[rand.IntN(len(c.slots))]
			c.fault("relay killed (context cancelled)")
			s.cancel()
			sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			_ = s.relay.Stop(sctx)
			cancel()
			rctx, rcancel := context.WithCancel(ctx)
			s.cancel = rcancel
			require.NoError(t, s.relay.Start(rctx, s.client))
		case 1:
			s := c.slots[rand.IntN(len(c.slots))]
			c.fault("relay and client stopped, jobs cancelled")
			c.stopSlot(s, true)
			c.startSlot(s)
		case 2:
			c.fault("child worker SIGKILLed")
			c.killChild()
			c.startChild()
		default:
			c.fault("connection terminated")
			rows, err := c.admin.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()
				AND pid <> pg_backend_pid() AND application_name NOT LIKE $1 || '%' AND state <> 'idle'`, chaosLogApp)
			if err == nil {
				pids, _ := pgx.CollectRows(rows, pgx.RowTo[int])
				if len(pids) > 0 {
					_, _ = c.admin.Exec(ctx, "SELECT pg_terminate_backend($1)", pids[rand.IntN(len(pids))])
				}
			}
		}
	}

	// Calm: the child goes for good, everything drains; the operator keeps
	// resolving blocked subjects.
	// Settled within a minute on a quiet machine (the dead child's heads
	// come back after chaosDeadWorkerAfter); the bound leaves room for a busy
	// one, and River's rescuer, the stall it guards against, takes an hour.
	c.killChild()
	lastKill := time.Now()
	settled := false
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		var left int
		require.NoError(t, c.admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_events WHERE fanned_out_at IS NULL)
			+ (SELECT count(*) FROM outbox_deliveries) + (SELECT count(*) FROM outbox_chains)`).Scan(&left))
		if left == 0 {
			settled = true
			t.Logf("ordered chaos: settled %v after the last kill", time.Since(lastKill).Round(time.Millisecond))
			break
		}
		time.Sleep(50 * time.Millisecond) // polling the condition above
	}
	close(stop)
	bg.Wait()
	if !settled {
		dumpOrderedSummary(t, c.admin)
		rows, err := c.admin.Query(ctx, `SELECT j.id, j.kind, j.attempt, j.attempted_by, j.attempted_at - now(),
			(SELECT string_agg(r.attempt || ':' || r.proc || ':' || coalesce(r.outcome, 'open'), ' ') FROM chaos_runs r WHERE r.job_id = j.id)
			FROM river_job j WHERE j.state = 'running'`)
		if err == nil {
			for rows.Next() {
				v, _ := rows.Values()
				t.Logf("running: %v", v)
			}
			rows.Close()
		}
		for _, s := range c.slots {
			t.Logf("slot %d: client %s", s.index, s.id)
		}
		t.Fatal("the outbox never settled after the chaos")
	}
	for _, s := range c.slots {
		c.stopSlot(s, false)
	}
}

// chaosRun is one logged run.
type chaosRun struct {
	id             int64
	sub, subject   string
	n              int
	event          uuid.UUID
	job            int64
	attempt        int
	proc, outcome  string
	start, end     time.Time
	committed      bool
	refusedOrAbort bool // did not commit, and may overlap another run (see check)
}

func (c *orderedChaos) check() {
	t := c.t
	ctx := context.Background()
	var faults []string
	c.faults.Range(func(k, v any) bool {
		faults = append(faults, fmt.Sprintf("%s: %d", k, v.(*atomic.Int32).Load()))
		return true
	})
	sort.Strings(faults)

	// River's final word on each job, and the ledger's committed runs.
	type jobEnd struct {
		state   string
		attempt int
	}
	jobs := map[int64]jobEnd{}
	rows, err := c.admin.Query(ctx, "SELECT id, state::text, attempt FROM river_job")
	require.NoError(t, err)
	for rows.Next() {
		var (
			id int64
			je jobEnd
		)
		require.NoError(t, rows.Scan(&id, &je.state, &je.attempt))
		jobs[id] = je
	}
	require.NoError(t, rows.Err())
	doneRuns := map[int64]bool{}
	doneByEvent := map[uuid.UUID]int{}
	rows, err = c.admin.Query(ctx, "SELECT run_id, event_id FROM chaos_done")
	require.NoError(t, err)
	for rows.Next() {
		var (
			run int64
			id  uuid.UUID
		)
		require.NoError(t, rows.Scan(&run, &id))
		doneRuns[run] = true
		doneByEvent[id]++
	}
	require.NoError(t, rows.Err())

	var runs []chaosRun
	rows, err = c.admin.Query(ctx, `SELECT id, sub, subject, n, event_id, job_id, attempt, proc, coalesce(outcome, ''), started_at,
		coalesce(ended_at, clock_timestamp() + interval '1 day') FROM chaos_runs ORDER BY started_at`)
	require.NoError(t, err)
	for rows.Next() {
		var r chaosRun
		require.NoError(t, rows.Scan(&r.id, &r.sub, &r.subject, &r.n, &r.event, &r.job, &r.attempt, &r.proc, &r.outcome, &r.start, &r.end))
		if at, killed := c.killedAt[r.proc]; killed && r.end.After(at) {
			r.end = at // it ended with its process, whatever was logged after
		}
		r.committed = r.sub == "ledger" && doneRuns[r.id]
		runs = append(runs, r)
	}
	require.NoError(t, rows.Err())
	// A feed job's committed run is the last run that ended well in its
	// final attempt (a client's stop gives an attempt back: two runs may
	// share one).
	lastOK := map[int64]int{}
	for i, r := range runs {
		je := jobs[r.job]
		if r.sub == "feed" && r.outcome == "ok" && je.state == "completed" && je.attempt == r.attempt {
			lastOK[r.job] = i
		}
	}
	for _, i := range lastOK {
		runs[i].committed = true
	}
	// A run that did not commit may overlap another when it ended well
	// (its commit refused, or lost with its connection), was cut short
	// (killed with its process, cancelled with its client), or was rescued
	// from under it (a zombie), whatever it then returned.
	for i := range runs {
		r := &runs[i]
		r.refusedOrAbort = !r.committed && (r.outcome != "error" || (r.sub == "ledger" && zombieRun(r.subject, r.n, r.attempt)))
	}

	// Every event, per subject in commit order (n).
	type ev struct {
		id uuid.UUID
		n  int
	}
	bySubject := map[string][]ev{}
	rows, err = c.admin.Query(ctx, "SELECT id, subject, (payload->>'n')::int FROM outbox_events")
	require.NoError(t, err)
	for rows.Next() {
		var (
			e       ev
			subject string
		)
		require.NoError(t, rows.Scan(&e.id, &subject, &e.n))
		bySubject[subject] = append(bySubject[subject], e)
	}
	require.NoError(t, rows.Err())

	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("ordered chaos violation: "+format, args...)
	}
	refused, overlapsAcross := 0, 0 // zombies' commits refused; runs of two subjects at once
	type key struct{ sub, subject string }
	per := map[key][]chaosRun{}
	for _, r := range runs {
		per[key{r.sub, r.subject}] = append(per[key{r.sub, r.subject}], r)
		if r.sub == "ledger" && zombieRun(r.subject, r.n, r.attempt) && r.outcome == "ok" && !r.committed {
			refused++ // a zombie's commit, refused
		}
	}
	for k, rs := range per {
		// Runs are sorted by start: each must begin after every earlier one
		// ended, unless one of the two did not commit without failing.
		for i := range rs {
			for j := i + 1; j < len(rs) && rs[j].start.Before(rs[i].end); j++ {
				if !rs[i].refusedOrAbort && !rs[j].refusedOrAbort {
					fail("%s/%s: run %d (n %d, attempt %d, %s, %s) and run %d (n %d, attempt %d, %s, %s) overlap",
						k.sub, k.subject, rs[i].id, rs[i].n, rs[i].attempt, rs[i].proc, rs[i].outcome, rs[j].id, rs[j].n, rs[j].attempt, rs[j].proc, rs[j].outcome)
				}
			}
		}
		last := 0
		for _, r := range rs {
			if !r.committed {
				continue
			}
			if r.n <= last {
				fail("%s/%s: committed run of n %d after n %d: out of commit order", k.sub, k.subject, r.n, last)
			}
			last = r.n
		}
	}
	// Runs of different subjects overlapped: subjects run in parallel.
	for i := range runs {
		for j := i + 1; j < len(runs) && runs[j].start.Before(runs[i].end); j++ {
			if runs[j].subject != runs[i].subject {
				overlapsAcross++
			}
		}
	}

	handled, skipped, discarded := 0, 0, 0
	committedFeed := map[uuid.UUID]int{}
	feedJobOf := map[uuid.UUID]int64{}
	for _, r := range runs {
		if r.sub == "feed" {
			feedJobOf[r.event] = r.job
			if r.committed {
				committedFeed[r.event]++
			}
		}
	}
	// A feed job whose every run died before logging its start (a child
	// SIGKILLed between River's fetch and the handler, twice: feed's jobs
	// have two attempts) is found by its args: the dead-worker rescue
	// discards a job whose attempts are spent, as River's rescuer does.
	rows, err = c.admin.Query(ctx, "SELECT (args->>'event_id')::uuid, id FROM river_job WHERE kind = $1", chaosArgs{}.Kind())
	require.NoError(t, err)
	for rows.Next() {
		var (
			id  uuid.UUID
			job int64
		)
		require.NoError(t, rows.Scan(&id, &job))
		if _, ok := feedJobOf[id]; !ok {
			feedJobOf[id] = job
		}
	}
	require.NoError(t, rows.Err())
	c.smu.Lock()
	defer c.smu.Unlock()
	for subject, es := range bySubject {
		sort.Slice(es, func(i, j int) bool { return es[i].n < es[j].n })
		for i, e := range es {
			if e.n != i+1 {
				fail("%s: events are numbered %d at %d", subject, e.n, i+1)
			}
			switch n := doneByEvent[e.id]; {
			case n > 1:
				fail("ledger: event %s (%s #%d) handled %d times", e.id, subject, e.n, n)
			case n == 1:
				handled++
			case c.skipped[e.id]:
				skipped++
			default:
				fail("ledger: event %s (%s #%d) neither handled nor skipped", e.id, subject, e.n)
			}
			switch n := committedFeed[e.id]; {
			case n > 1:
				fail("feed: event %s (%s #%d) completed %d times", e.id, subject, e.n, n)
			case n == 1:
			case jobs[feedJobOf[e.id]].state == "discarded":
				discarded++ // OrderedContinue went on past it
			default:
				fail("feed: event %s (%s #%d) neither completed nor discarded (job %d: %+v)", e.id, subject, e.n, feedJobOf[e.id], jobs[feedJobOf[e.id]])
			}
		}
	}
	// The jobs the relays gave back from killed children (ChainRescue's
	// error on the job): nothing else in the run does.
	var givenBack int
	require.NoError(t, c.admin.QueryRow(ctx, `SELECT count(*) FROM river_job
		WHERE EXISTS (SELECT FROM jsonb_array_elements(to_jsonb(errors)) e WHERE e->>'error' LIKE '%stopped heartbeating%')`).Scan(&givenBack))
	t.Logf("ordered chaos: %d events over %d subjects; %d runs; ledger: %d handled, %d skipped, %d zombies hung, %d commits refused; feed: %d discarded and passed; %d overlaps across subjects; killed children left %d jobs running, the relays gave %d back; faults: %s",
		handled+skipped, len(bySubject), len(runs), handled, skipped, c.hung.Load(), refused, discarded, overlapsAcross, c.childHeld, givenBack, strings.Join(faults, ", "))
	if c.childHeld > 0 {
		require.Positive(t, givenBack, "killed children left jobs running, but no relay gave one back")
	}
	if c.hung.Load() > 0 {
		require.Positive(t, refused, "zombies hung, but no commit was refused")
	}
	require.Positive(t, c.hung.Load(), "no zombie hung: the run was too short")
	require.Positive(t, overlapsAcross, "no two subjects ever ran at once")
}
