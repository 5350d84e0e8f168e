package events

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/listener"
	"github.com/standmeet/events/internal/testdb"
)

// TestChaosSoak runs a randomized workload against several relays while
// faults are injected, then checks the final state against what the writers
// know they committed. It runs for EVENTS_SOAK (a Go duration; default 40s)
// with the seed EVENTS_SOAK_SEED (default: the clock), printed so a failing
// run can be repeated:
//
//	EVENTS_SOAK=10m EVENTS_SOAK_SEED=42 go test -run TestChaosSoak -timeout 30m .
func TestChaosSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("the 40 s chaos soak: run without -short (CI always does)")
	}
	duration := 40 * time.Second
	if v := os.Getenv("EVENTS_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "EVENTS_SOAK")
		duration = d
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("EVENTS_SOAK_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "EVENTS_SOAK_SEED")
		seed = s
	}
	t.Logf("chaos soak: seed %d, %v (repeat with EVENTS_SOAK_SEED=%d EVENTS_SOAK=%v)", seed, duration, seed, duration)
	s := newSoak(t, seed)
	s.run(duration)
	s.check()
}

// Subscribers of the soak. "mail" fails transiently; "ledger" always fails
// for ledger.* events: those pairs, and only those, must end poisoned, while
// the other subscribers of ledger.* events get their jobs. "ghost" is
// registered, with note.* types, and never run: an orphan, owed every
// note.* event. "history" is added partway through, on some of the relays,
// and given the events since a mid-run time by a Backfill that runs (and is
// interrupted and resumed) while the chaos goes on.
var soakTypes = []string{"order.placed", "order.paid", "note.changed", "supplier.connected", "ledger.entry"}

type soak struct {
	t       *testing.T
	cluster *testdb.Cluster
	admin   *pgxpool.Pool
	rng     *rand.Rand
	rngMu   sync.Mutex

	// What the writers know.
	mu         sync.Mutex
	committed  map[uuid.UUID]bool // commit returned success
	rolledBack map[uuid.UUID]bool // explicit rollback
	unknown    map[uuid.UUID]bool // commit returned an error: may or may not exist
	paused     bool               // "webhooks" is paused (the chaos loop's alone)
	receipts   map[uuid.UUID]Receipt
	// poisonRcpt holds the ID groups for which AwaitFanout said ErrPoisoned.
	poisonRcpt [][]uuid.UUID

	// committedAt is when each committed event's COMMIT was sent.
	committedAt map[uuid.UUID]time.Time
	// A rolling deploy: the new release adds the subscriber "audit". auditSince
	// is when the first relay of the new release had registered it (Start
	// returned); zero before.
	deploying  atomic.Bool
	auditSince time.Time
	auditMu    sync.Mutex

	// The backfill phase: relays other than the first one restarted from
	// historyOn on have the subscriber "history"; historySince is when the
	// first of them had registered it (Start returned), historyFrom the since
	// its Backfill was given. bf is what the Backfill calls did.
	historyOn    atomic.Bool
	historySince time.Time
	historyFrom  time.Time
	bf           backfillRun

	mailFailed sync.Map // event ID -> true once mail's Map failed for it
	faults     map[string]int
	faultsMu   sync.Mutex
	writes     atomic.Int64
}

func newSoak(t *testing.T, seed uint64) *soak {
	c := testdb.NewCluster(t)
	s := &soak{
		t: t, cluster: c, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		committed: map[uuid.UUID]bool{}, rolledBack: map[uuid.UUID]bool{}, unknown: map[uuid.UUID]bool{},
		receipts: map[uuid.UUID]Receipt{}, faults: map[string]int{}, committedAt: map[uuid.UUID]time.Time{},
	}
	s.admin = testdb.Pool(t, c.URL)
	ctx := context.Background()
	_, err := s.admin.Exec(ctx, `CREATE TABLE soak_notes (id int PRIMARY KEY, title text NOT NULL)`)
	require.NoError(t, err)
	_, err = s.admin.Exec(ctx, `INSERT INTO soak_notes SELECT g, 'n' FROM generate_series(1, 20) g`)
	require.NoError(t, err)
	ghost, err := newSubscription(Subscriber{Name: "ghost", Types: []string{"note.*"}, Map: func(context.Context, Event) (river.JobArgs, *river.InsertOpts, error) {
		return nil, nil, nil
	}})
	require.NoError(t, err)
	sql, err := statementsFor("")
	require.NoError(t, err)
	_, err = registerSubscribers(ctx, s.admin, sql, []string{"ghost"}, ghost)
	require.NoError(t, err)
	require.NoError(t, outbox.InstallWatch(ctx, s.admin, Watch{Table: "soak_notes",
		Types: map[Op]string{OpUpdate: "note.changed"}, Columns: []string{"title"}, SubjectPrefix: "subject-"}))
	return s
}

func (s *soak) intn(n int) int {
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return s.rng.IntN(n)
}

func (s *soak) fault(kind string) {
	s.faultsMu.Lock()
	s.faults[kind]++
	s.faultsMu.Unlock()
}

// historyTypes are the type globs of "history": some of the workload's.
var historyTypes = []string{"order.paid", "supplier.**"}

// subscribers are the subscribers of a release: the new one adds "audit";
// history adds "history".
func (s *soak) subscribers(newRelease, history bool) []Subscriber {
	mapTo := func(name string) func(context.Context, Event) (river.JobArgs, *river.InsertOpts, error) {
		return func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			switch name {
			case "mail":
				// Fails the first time it meets an event in three, then clears.
				if e.Seq%3 == 0 {
					if _, failedBefore := s.mailFailed.LoadOrStore(e.ID, true); !failedBefore {
						return nil, nil, errors.New("smtp relay warming up")
					}
				}
			case "ledger":
				return nil, nil, errors.New("ledger schema mismatch")
			}
			return testArgs{EventID: e.ID, Subject: e.Subject}, nil, nil
		}
	}
	subs := []Subscriber{
		{Name: "webhooks", Types: []string{"**"}, Map: mapTo("webhooks")},
		{Name: "mail", Types: []string{"order.*", "note.*"}, Map: mapTo("mail")},
		{Name: "search", Types: []string{"**"}, Coalesce: true, Map: mapTo("search")},
		{Name: "ledger", Types: []string{"ledger.**"}, Map: mapTo("ledger")},
	}
	if newRelease {
		subs = append(subs, Subscriber{Name: "audit", Types: []string{"order.*", "supplier.**"}, Map: mapTo("audit")})
	}
	if history {
		subs = append(subs, Subscriber{Name: "history", Types: historyTypes, Map: mapTo("history")})
	}
	return subs
}

// relaySlot is one "process": a pool, a River client and a relay that chaos
// restarts.
type relaySlot struct {
	pool       *pgxpool.Pool
	client     *river.Client[pgx.Tx]
	relay      *Relay
	cancel     context.CancelFunc
	newRelease bool
	index      int  // slot 0 never gets "history"
	history    bool // the relay has "history"
}

func (s *soak) startSlot(slot *relaySlot) {
	relay, err := NewRelay(slot.pool, &RelayConfig{
		BatchSize: 1 + s.intn(60), RetryBackoff: 20 * time.Millisecond, MaxRetryBackoff: 300 * time.Millisecond,
		Listener: ListenerConfig{ReconnectBackoff: 20 * time.Millisecond, MaxReconnectBackoff: 300 * time.Millisecond}, Logger: quietLogger(),
	})
	require.NoError(s.t, err)
	// Once the deploy began, a restarted process runs the new release.
	slot.newRelease = s.deploying.Load()
	// Once the backfill phase began, a restarted process other than the
	// first one has "history".
	slot.history = s.historyOn.Load() && slot.index != 0
	for _, sub := range s.subscribers(slot.newRelease, slot.history) {
		require.NoError(s.t, relay.Subscribe(sub))
	}
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(s.t, relay.Start(ctx, slot.client))
	slot.relay, slot.cancel = relay, cancel
	if slot.newRelease {
		s.auditMu.Lock()
		if s.auditSince.IsZero() {
			s.auditSince = time.Now()
		}
		s.auditMu.Unlock()
	}
	if slot.history {
		s.auditMu.Lock()
		if s.historySince.IsZero() {
			s.historySince = time.Now()
		}
		s.auditMu.Unlock()
	}
}

func (s *soak) stopSlot(slot *relaySlot, abrupt bool) {
	if abrupt {
		slot.cancel() // mid-round, if a round is in flight
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = slot.relay.Stop(stopCtx)
	slot.cancel()
}

func (s *soak) run(duration time.Duration) {
	t := s.t
	var slots []*relaySlot
	for i := range 3 {
		pool := testdb.Pool(t, s.cluster.URL)
		client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quietLogger()})
		require.NoError(t, err)
		slot := &relaySlot{pool: pool, client: client, index: i}
		s.startSlot(slot)
		slots = append(slots, slot)
	}
	writerPool := testdb.Pool(t, s.cluster.URL)
	awaiter, err := NewAwaiter(writerPool, &AwaiterConfig{Logger: quietLogger(), NotFoundGrace: 10 * time.Second,
		Listener: ListenerConfig{ReconnectBackoff: 20 * time.Millisecond, MaxReconnectBackoff: 300 * time.Millisecond}})
	require.NoError(t, err)
	require.NoError(t, awaiter.Start(context.Background()))
	defer awaiter.Stop(context.Background())

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.writer(w, writerPool, awaiter, stop)
		}()
	}

	// Chaos: a fault every 100–600 ms, and one full restart mid-run. After a
	// quarter of the run a rolling deploy begins: relays restarted from then
	// on run the new release, side by side with the old one. At three
	// eighths the backfill phase begins: the second relay restarts with
	// "history" (relays other than the first restarted afterwards have it
	// too), and a Backfill from an eighth of the run begins; interrupted
	// after its first batch, it is resumed at five eighths, past the
	// postgres restart, while the chaos goes on.
	restartAt := time.Now().Add(duration / 2)
	deployAt := time.Now().Add(duration / 4)
	backfillAt := time.Now().Add(duration * 3 / 8)
	resumeAt := time.Now().Add(duration * 5 / 8)
	s.historyFrom = time.Now().Add(duration / 8)
	var backfilled <-chan struct{}
	resume := make(chan struct{})
	resumed := false
	restarted := false
	deadline := time.Now().Add(duration)
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(100+s.intn(500)) * time.Millisecond)
		if !s.deploying.Load() && time.Now().After(deployAt) {
			s.deploying.Store(true)
			s.fault("rolling deploy began")
			s.stopSlot(slots[0], false)
			s.startSlot(slots[0])
			continue
		}
		if !s.historyOn.Load() && time.Now().After(backfillAt) {
			s.historyOn.Store(true)
			s.fault("backfill began")
			s.stopSlot(slots[1], false)
			s.startSlot(slots[1])
			backfilled = s.backfill(resume)
			continue
		}
		if backfilled != nil && !resumed && time.Now().After(resumeAt) {
			resumed = true
			s.fault("backfill resumed")
			close(resume)
			continue
		}
		if !restarted && time.Now().After(restartAt) {
			restarted = true
			s.fault("postgres restart")
			s.cluster.Stop()
			time.Sleep(time.Duration(200+s.intn(800)) * time.Millisecond)
			require.NoError(t, s.cluster.Start(context.Background()))
			continue
		}
		if s.intn(6) == 0 {
			// An operator pauses "webhooks" (its pairs are owed meanwhile)
			// or resumes it: the deliveries lane drains what was owed
			// beside the fresh events, on whichever relays run.
			s.togglePause()
			continue
		}
		switch s.intn(5) {
		case 0:
			slot := slots[s.intn(len(slots))]
			s.fault("relay stopped gracefully")
			s.stopSlot(slot, false)
			s.startSlot(slot)
		case 1:
			slot := slots[s.intn(len(slots))]
			s.fault("relay killed (context cancelled)")
			s.stopSlot(slot, true)
			s.startSlot(slot)
		case 2:
			s.fault("listener connection terminated")
			s.terminate(`application_name IN ('` + listener.ApplicationName + `', '` + listener.AwaiterApplicationName + `')`)
		default:
			s.fault("relay or writer connection terminated")
			s.terminate(`application_name NOT IN ('` + listener.ApplicationName + `', '` + listener.AwaiterApplicationName + `') AND state <> 'idle'`)
		}
	}
	close(stop)
	wg.Wait()
	if backfilled != nil {
		if !resumed {
			close(resume)
		}
		<-backfilled
	}

	if s.paused {
		s.togglePause()
	}

	// The deploy ends: the old release's relays that are left are replaced.
	for _, slot := range slots {
		if !slot.newRelease {
			s.stopSlot(slot, false)
			s.startSlot(slot)
		}
	}

	// Calm: everything settles with the relays that are left running, the
	// deliveries lane included (only the orphan's pairs stay owed).
	settled := assert.Eventually(t, func() bool {
		var pending int
		err := s.admin.QueryRow(context.Background(),
			`SELECT (SELECT count(*) FROM outbox_events WHERE (fanned_out_at IS NULL OR catch_up IS NOT NULL) AND poisoned_at IS NULL)
			      + (SELECT count(*) FROM outbox_deliveries WHERE poisoned_at IS NULL AND subscriber <> 'ghost')`).Scan(&pending)
		return err == nil && pending == 0
	}, 2*time.Minute, 20*time.Millisecond, "events or pairs still pending after the chaos stopped")
	if !settled {
		rows, err := s.admin.Query(context.Background(), `SELECT id, type, attempts, coalesce(last_error, ''),
			coalesce(next_attempt_at::text, ''), (SELECT count(*) FROM pg_locks l WHERE l.locktype = 'transactionid') FROM outbox_events
			WHERE fanned_out_at IS NULL AND poisoned_at IS NULL LIMIT 10`)
		if err == nil {
			for rows.Next() {
				var id, typ, lastErr, next string
				var attempts, locks int
				_ = rows.Scan(&id, &typ, &attempts, &lastErr, &next, &locks)
				t.Logf("pending: %s %s attempts=%d next=%s locks=%d err=%s", id, typ, attempts, next, locks, lastErr)
			}
			rows.Close()
		}
		activity, _ := s.admin.Query(context.Background(), "SELECT coalesce(application_name, ''), state, coalesce(query, '') FROM pg_stat_activity WHERE datname = current_database()")
		if activity != nil {
			for activity.Next() {
				var app, state, query string
				_ = activity.Scan(&app, &state, &query)
				t.Logf("backend: %s %s %.120s", app, state, query)
			}
			activity.Close()
		}
		t.FailNow()
	}
	for _, slot := range slots {
		s.stopSlot(slot, false)
	}
}

// togglePause pauses "webhooks" if it runs, resumes it if paused.
func (s *soak) togglePause() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	op, do := "resumed", outbox.ResumeSubscriber
	if !s.paused {
		op, do = "paused", outbox.PauseSubscriber
	}
	// The server may be restarting: an operator tries again.
	for ctx.Err() == nil {
		if err := do(ctx, s.admin, "webhooks"); err == nil {
			s.paused = !s.paused
			s.fault("webhooks " + op)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("webhooks could not be %s", op)
}

// backfillRun is what the soak's Backfill calls did.
type backfillRun struct {
	calls       int
	owed        int64          // pairs the calls wrote, as they reported them
	interrupted int64          // the seq progress had reached when the first call was interrupted; 0 if it never was
	final       BackfillResult // the call that finished
	finished    bool
}

// backfill runs outbox.Backfill(ctx, db, "history", s.historyFrom) in a goroutine,
// while the chaos goes on, until a call finishes; the returned channel is
// closed then. The first call is interrupted (its context cancelled) once a
// batch of it committed; the next one is made when resume is closed, later
// in the run, and must go on from there: by then the events stamped since
// the registration have their history jobs, and the resumed Backfill must
// owe them nothing. A call the chaos breaks (a connection terminated, the
// server restarting) is made again, as an operator would.
func (s *soak) backfill(resume <-chan struct{}) <-chan struct{} {
	pool := testdb.Pool(s.t, s.cluster.URL)
	sql, err := statementsFor("")
	require.NoError(s.t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		giveUp := time.Now().Add(2 * time.Minute)
		for {
			ctx, cancel := context.WithCancel(context.Background())
			var db DB = pool
			var ir *interruptAfterBatch
			if s.bf.interrupted == 0 {
				ir = &interruptAfterBatch{DB: pool, batch: sql.BackfillBatch, cancel: cancel}
				db = ir
			}
			res, err := outbox.Backfill(ctx, db, "history", s.historyFrom)
			cancel()
			s.bf.calls++
			s.bf.owed += res.Owed
			if ir != nil && ir.fired {
				s.bf.interrupted = ir.progress
				s.fault("backfill interrupted")
				<-resume
				giveUp = time.Now().Add(2 * time.Minute)
				continue
			}
			switch {
			case err == nil:
				s.bf.final, s.bf.finished = res, true
				return
			case errors.Is(err, ErrUnknownSubscriber):
				s.t.Errorf("backfill: %v", err)
				return
			case time.Now().After(giveUp):
				s.t.Errorf("backfill: still failing after 2 minutes: %v", err)
				return
			}
			time.Sleep(20 * time.Millisecond) // a retry's backoff: the server may be restarting
		}
	}()
	return done
}

// interruptAfterBatch is a DB for Backfill that cancels its context once a
// batch statement returned: the statement after it fails.
type interruptAfterBatch struct {
	DB
	batch    string
	cancel   context.CancelFunc
	batched  bool
	fired    bool
	progress int64 // the seq the batch that returned went up to
}

func (d *interruptAfterBatch) interrupt() {
	if d.batched {
		d.fired = true
		d.cancel()
	}
}

func (d *interruptAfterBatch) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	d.interrupt()
	return d.DB.Exec(ctx, sql, args...)
}

func (d *interruptAfterBatch) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	d.interrupt()
	return d.DB.Query(ctx, sql, args...)
}

func (d *interruptAfterBatch) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	d.interrupt()
	row := d.DB.QueryRow(ctx, sql, args...)
	if sql != d.batch {
		return row
	}
	return scanHook{row, func() {
		d.batched = true
		d.progress, _ = args[3].(int64)
	}}
}

// scanHook calls scanned after a successful Scan.
type scanHook struct {
	pgx.Row
	scanned func()
}

func (r scanHook) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	if err == nil {
		r.scanned()
	}
	return err
}

// terminate kills one random backend of the soak's database matching where.
func (s *soak) terminate(where string) {
	rows, err := s.admin.Query(context.Background(), "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND "+where)
	if err != nil {
		return // the server may be restarting
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil || len(pids) == 0 {
		return
	}
	_, _ = s.admin.Exec(context.Background(), "SELECT pg_terminate_backend($1)", pids[s.intn(len(pids))])
}

func (s *soak) event() Event {
	typ := soakTypes[s.intn(len(soakTypes))]
	if typ == "ledger.entry" && s.intn(4) != 0 {
		typ = "order.placed" // keep poisoned events a minority
	}
	return Event{Type: typ, Subject: fmt.Sprintf("subject-%d", 1+s.intn(20)), Payload: []byte(`{"n":` + strconv.Itoa(s.intn(1000)) + `}`)}
}

// writer records events in every way the library offers, and logs what it
// knows committed.
func (s *soak) writer(w int, pool *pgxpool.Pool, awaiter *Awaiter, stop <-chan struct{}) {
	ctx := context.Background()
	for {
		select {
		case <-stop:
			return
		default:
		}
		var ids []uuid.UUID
		action := s.intn(10)
		tx, err := pool.Begin(ctx)
		if err != nil {
			time.Sleep(20 * time.Millisecond) // the server may be restarting
			continue
		}
		switch {
		case action < 4:
			var e Event
			if e, err = Record(ctx, tx, s.event()); err == nil {
				ids = append(ids, e.ID)
			}
		case action < 6:
			es := make([]Event, 1+s.intn(40))
			for i := range es {
				es[i] = s.event()
			}
			if es, err = RecordMany(ctx, tx, es); err == nil {
				for _, e := range es {
					ids = append(ids, e.ID)
				}
			}
		case action < 8:
			// Through the watched table's trigger.
			var made []Event
			if _, err = tx.Exec(ctx, "UPDATE soak_notes SET title = md5(random()::text) WHERE id = $1 OR id = $2", 1+s.intn(20), 1+s.intn(20)); err == nil {
				if made, err = RecordedInTx(ctx, tx); err == nil {
					for _, e := range made {
						ids = append(ids, e.ID)
					}
				}
			}
		default:
			// A long transaction that others commit past.
			var e Event
			if e, err = Record(ctx, tx, s.event()); err == nil {
				ids = append(ids, e.ID)
				time.Sleep(time.Duration(500+s.intn(2000)) * time.Millisecond)
			}
		}
		if err != nil {
			_ = tx.Rollback(ctx)
			continue
		}
		if s.intn(8) == 0 {
			_ = tx.Rollback(ctx)
			s.mu.Lock()
			for _, id := range ids {
				s.rolledBack[id] = true
			}
			s.mu.Unlock()
			continue
		}
		commitAt := time.Now()
		err = tx.Commit(ctx)
		s.mu.Lock()
		for _, id := range ids {
			if err == nil {
				s.committed[id] = true
				s.committedAt[id] = commitAt
			} else {
				s.unknown[id] = true // the commit may have landed before the connection died
			}
		}
		s.mu.Unlock()
		s.writes.Add(1)
		if err != nil || len(ids) == 0 || s.intn(3) != 0 {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, 60*time.Second)
		receipts, err := awaiter.AwaitFanout(actx, ids...)
		cancel()
		s.mu.Lock()
		switch {
		case err == nil:
			for _, r := range receipts {
				s.receipts[r.EventID] = r
			}
		case errors.Is(err, ErrPoisoned):
			s.poisonRcpt = append(s.poisonRcpt, ids)
		default:
			s.mu.Unlock()
			s.t.Errorf("writer %d: AwaitFanout: %v", w, err)
			continue
		}
		s.mu.Unlock()
	}
}

// check reads the final state and fails on the first violation.
func (s *soak) check() {
	t := s.t
	rows := loadRows(t, s.admin)
	jobs := loadJobs(t, s.admin)
	poisoned := 0
	for _, ps := range loadPairs(t, s.admin) {
		for _, p := range ps {
			if p.Poisoned {
				poisoned++
			}
		}
	}
	s.faultsMu.Lock()
	var faults []string
	for k, n := range s.faults {
		faults = append(faults, fmt.Sprintf("%s: %d", k, n))
	}
	s.faultsMu.Unlock()
	sort.Strings(faults)
	audited := 0
	for _, r := range rows {
		if _, ok := r.Fanout["audit"]; ok {
			audited++
		}
	}
	t.Logf("chaos soak: %d events reached the subscriber added by the rolling deploy", audited)
	// The backfill phase happened, and its interrupted Backfill resumed.
	backfillPhase := !s.historySince.IsZero()
	if backfillPhase {
		t.Logf("chaos soak: backfill of history since %v (registered %v): %d calls, %d pairs owed, interrupted at seq %d, the call that finished resumed after seq %d",
			s.historyFrom.Format(time.StampMicro), s.historySince.Format(time.StampMicro), s.bf.calls, s.bf.owed, s.bf.interrupted, s.bf.final.ResumedAt)
		require.True(t, s.bf.finished, "the backfill never finished")
		require.NotZero(t, s.bf.interrupted, "the backfill was never interrupted after a batch")
		require.GreaterOrEqual(t, s.bf.final.ResumedAt, s.bf.interrupted, "the backfill did not resume where it was interrupted")
		subs, err := outbox.ListSubscribers(context.Background(), s.admin)
		require.NoError(t, err)
		i := slices.IndexFunc(subs, func(sub SubscriberInfo) bool { return sub.Name == "history" })
		require.GreaterOrEqual(t, i, 0, "history is not registered")
		require.False(t, subs[i].BackfillDoneAt.IsZero(), "the registry does not show history's backfill done: %+v", subs[i])
	} else {
		t.Logf("chaos soak: the run was too short for the backfill phase")
	}
	t.Logf("chaos soak: %d transactions, %d events (%d committed, %d unknown outcome, %d rolled back), %d jobs, %d poisoned, %d receipts (%d poisoned); faults: %s",
		s.writes.Load(), len(rows), len(s.committed), len(s.unknown), len(s.rolledBack), len(jobs), poisoned, len(s.receipts), len(s.poisonRcpt), strings.Join(faults, ", "))

	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("chaos soak violation: "+format, args...)
	}
	for id := range s.committed {
		if _, ok := rows[id]; !ok {
			fail("committed event %s is missing", id)
		}
	}
	for id := range s.rolledBack {
		if _, ok := rows[id]; ok {
			fail("rolled-back event %s exists", id)
		}
	}
	var subscriptions []*subscription
	for _, sub := range s.subscribers(true, true) {
		c, err := newSubscription(sub)
		require.NoError(t, err)
		subscriptions = append(subscriptions, c)
	}
	jobsOf := map[string]map[uuid.UUID][]int64{} // subscriber -> event -> jobs carrying it
	for _, j := range jobs {
		if jobsOf[j.Subscriber] == nil {
			jobsOf[j.Subscriber] = map[uuid.UUID][]int64{}
		}
		jobsOf[j.Subscriber][j.EventID] = append(jobsOf[j.Subscriber][j.EventID], j.ID)
	}
	pairs := loadPairs(t, s.admin)
	history := subscriptions[slices.IndexFunc(subscriptions, func(c *subscription) bool { return c.Name == "history" })]
	since := s.historyFrom.Truncate(time.Microsecond) // as Backfill compares it
	historyJobs := 0
	ghostOwed := 0
	named := map[int64]bool{}
	for id, r := range rows {
		if !s.committed[id] && !s.unknown[id] {
			fail("event %s (%s) exists but no writer committed it", id, r.Type)
		}
		switch {
		case r.Poisoned:
			fail("event %s (%s) is poisoned as a whole: %v", id, r.Type, r.LastError)
		case !r.FannedOut:
			fail("event %s is neither fanned out nor poisoned", id)
		}
		for sub, p := range pairs[id] {
			switch sub {
			case "ghost":
				if p.Poisoned || !strings.HasPrefix(r.Type, "note.") {
					fail("event %s (%s): ghost's pair %+v", id, r.Type, p)
				}
				ghostOwed++
			case "ledger":
				if !p.Poisoned || !strings.HasPrefix(r.Type, "ledger.") || p.Attempts != 5 || p.Errors != 5 {
					fail("event %s (%s): ledger's pair %+v", id, r.Type, p)
				}
			default:
				fail("event %s (%s): pair of %s still owed or poisoned after the calm: %+v", id, r.Type, sub, p)
			}
		}
		if strings.HasPrefix(r.Type, "note.") {
			if _, ok := pairs[id]["ghost"]; !ok {
				fail("event %s (%s) is not owed to the orphan ghost", id, r.Type)
			}
		}
		for _, sub := range subscriptions {
			jobID, has := r.Fanout[sub.Name]
			_, owed := pairs[id][sub.Name]
			switch {
			case has && !sub.matches(r.Type):
				fail("event %s (%s): fanout %v names %s, which does not match", id, r.Type, r.Fanout, sub.Name)
			case has && owed:
				fail("event %s (%s): %s has both a job and an owed pair", id, r.Type, sub.Name)
			case sub.Name == "ledger" && sub.matches(r.Type) && !owed:
				fail("event %s (%s): the always-failing ledger pair is not poisoned", id, r.Type)
			case !has && !owed && sub.matches(r.Type) && sub.Name != "audit" && sub.Name != "history":
				fail("event %s (%s): fanout %v lacks %s", id, r.Type, r.Fanout, sub.Name)
			case !has && sub.matches(r.Type) && sub.Name == "audit" && !s.auditSince.IsZero() && s.committedAt[id].After(s.auditSince):
				fail("event %s (%s) committed %v after audit's registration (%v) never reached it: fanout %v",
					id, r.Type, s.committedAt[id].Format(time.StampMicro), s.auditSince.Format(time.StampMicro), r.Fanout)
			}
			if !has {
				if sub.matches(r.Type) && len(jobsOf[sub.Name][id]) > 0 && !sub.Coalesce {
					fail("event %s: %s has jobs %v but no fanout entry", id, sub.Name, jobsOf[sub.Name][id])
				}
				continue
			}
			named[jobID] = true
			job, ok := jobs[jobID]
			if !ok {
				fail("event %s: fanout names job %d of %s, which does not exist", id, jobID, sub.Name)
			}
			if job.Subscriber != sub.Name {
				fail("event %s: fanout[%s] names job %d of %s", id, sub.Name, jobID, job.Subscriber)
			}
			if !sub.Coalesce {
				if got := jobsOf[sub.Name][id]; len(got) != 1 || got[0] != jobID {
					fail("event %s: %s must have exactly one job, the one its fanout names (%d); it has %v", id, sub.Name, jobID, got)
				}
				continue
			}
			carried, ok := rows[job.EventID]
			if !ok || carried.Subject != r.Subject || carried.Seq < r.Seq {
				fail("event %s (seq %d, %s): coalesced into job %d carrying event %s (seq %d, %s)", id, r.Seq, r.Subject, jobID, job.EventID, carried.Seq, carried.Subject)
			}
		}
		// history: one job for every matching event it is owed, the ones
		// fanned out before its backfill created since historyFrom and the
		// ones committed after its registration; at most one for the other
		// matching events (created before since but fanned out after the
		// registration); none for an event that does not match.
		switch got := jobsOf["history"][id]; {
		case !history.matches(r.Type) && len(got) > 0:
			fail("event %s (%s) does not match history's types %v but has history jobs %v", id, r.Type, historyTypes, got)
		case len(got) > 1:
			fail("event %s (%s) has %d history jobs: %v", id, r.Type, len(got), got)
		case backfillPhase && history.matches(r.Type) && len(got) == 0 &&
			(!r.CreatedAt.Before(since) || s.committedAt[id].After(s.historySince)):
			fail("event %s (%s, seq %d, created %v, committed %v) is owed to history (backfilled since %v, registered %v) but has no history job: fanout %v",
				id, r.Type, r.Seq, r.CreatedAt.Format(time.StampMicro), s.committedAt[id].Format(time.StampMicro),
				since.Format(time.StampMicro), s.historySince.Format(time.StampMicro), r.Fanout)
		}
		historyJobs += len(jobsOf["history"][id])
		if want, ok := s.receipts[id]; ok {
			// A receipt is read when the event's round committed: every job
			// it names is the row's; a subscriber it lists as owed or
			// poisoned had no job then.
			for sub, jobID := range want.Fanout {
				if r.Fanout[sub] != jobID {
					fail("event %s: AwaitFanout answered %v, the row holds %v", id, want.Fanout, r.Fanout)
				}
			}
			for _, sub := range want.Owed {
				if _, had := want.Fanout[sub]; had {
					fail("event %s: receipt lists %s both with a job and owed", id, sub)
				}
			}
			for sub := range want.Poisoned {
				if sub != "ledger" {
					fail("event %s: receipt says poisoned for %s", id, sub)
				}
			}
		}
	}
	t.Logf("chaos soak: %d events owed to the orphan, %d history jobs", ghostOwed, historyJobs)
	for jobID, j := range jobs {
		if !named[jobID] {
			fail("job %d (%s, event %s) is named by no fanout", jobID, j.Subscriber, j.EventID)
		}
	}
	for _, group := range s.poisonRcpt {
		any := false
		for _, id := range group {
			any = any || rows[id].Poisoned
		}
		if !any {
			fail("AwaitFanout said ErrPoisoned for %v, but none of them is poisoned", group)
		}
	}
}
