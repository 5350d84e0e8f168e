package events

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/listener"
	"github.com/standmeet/events/internal/testdb"
)

func startAwaiter(t *testing.T, b *testBundle, cfg *AwaiterConfig) *Awaiter {
	t.Helper()
	if cfg == nil {
		cfg = &AwaiterConfig{}
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	a, err := NewAwaiter(b.pool, cfg)
	require.NoError(t, err)
	require.NoError(t, a.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, a.Stop(context.Background())) })
	return a
}

func within(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestAwaitFanoutReturnsTheStoredFanout(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, mapSub("search", true, "**"), mapSub("webhooks", false, "**"))
	a := startAwaiter(t, b, nil)
	// Both in one batch, so the first is coalesced into the second's job.
	es := b.record(t, Event{Type: "note.changed", Subject: "n1"}, Event{Type: "note.renamed", Subject: "n1"})
	b.start(t)
	got, err := a.AwaitFanout(within(t, 30*time.Second), es[0].ID, es[1].ID)
	require.NoError(t, err)
	rows := loadRows(t, b.pool)
	for i, e := range es {
		require.Equal(t, e.ID, got[i].EventID)
		require.Equal(t, rows[e.ID].Fanout, got[i].Fanout)
		require.False(t, got[i].FannedOutAt.IsZero())
	}
	require.Equal(t, got[1].Fanout["search"], got[0].Fanout["search"], "the coalesced event's receipt names the job it went into")
	require.NotEqual(t, got[1].Fanout["webhooks"], got[0].Fanout["webhooks"])
}

func TestAwaitFanoutOfAnEventFannedOutBeforeTheCall(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	b.start(t)
	e := b.record(t, Event{Type: "a"})[0]
	waitFannedOut(t, b.pool, 10*time.Second)
	// Re-reads an hour apart: no notification is coming any more, and the
	// row itself must answer when asked.
	a := startAwaiter(t, b, &AwaiterConfig{Listener: ListenerConfig{PollInterval: time.Hour}})
	got, err := a.AwaitFanout(within(t, 30*time.Second), e.ID)
	require.NoError(t, err)
	require.Len(t, got[0].Fanout, 1)
}

// The writer's process runs no relay; the relay is another process with its
// own pool.
func TestAwaitFanoutFromAnotherProcess(t *testing.T) {
	t.Parallel()
	writer := setup(t, setupOpts{})
	relayProcess := setup(t, setupOpts{url: writer.url}, mapSub("audit", false, "**"))
	relayProcess.start(t)
	a := startAwaiter(t, writer, nil)
	for range 20 {
		e := writer.record(t, Event{Type: "a"})[0]
		got, err := a.AwaitFanout(within(t, 30*time.Second), e.ID)
		require.NoError(t, err)
		require.Len(t, got[0].Fanout, 1)
	}
}

func TestAwaitFanoutOfAPoisonedEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sub := Subscriber{Name: "broken", Types: []string{"**"},
		Map: func(context.Context, Event) (river.JobArgs, *river.InsertOpts, error) {
			return nil, nil, errors.New("no template for this event")
		}}
	b := setup(t, setupOpts{config: &RelayConfig{MaxAttempts: 1}}, sub, mapSub("audit", false, "**"))
	a := startAwaiter(t, b, nil)
	e := b.record(t, Event{Type: "a"})[0]
	b.start(t)
	// A subscriber whose Map fails does not hold the event back: the receipt
	// names the other's job and the poisoned pair.
	rcpt, err := a.AwaitFanout(within(t, 30*time.Second), e.ID)
	require.NoError(t, err)
	require.Contains(t, rcpt[0].Fanout, "audit")
	require.NotContains(t, rcpt[0].Fanout, "broken")
	require.Contains(t, rcpt[0].Poisoned["broken"], "no template for this event")

	// An event poisoned as a whole (its stamp could not be written) is an
	// error.
	whole := Event{ID: uuid.Must(uuid.NewV7())}
	_, err = b.pool.Exec(ctx, `INSERT INTO outbox_events (id, type, attempts, last_error, poisoned_at)
		VALUES ($1, 'a', 5, 'stamp refused', now())`, whole.ID)
	require.NoError(t, err)
	_, err = a.AwaitFanout(within(t, 30*time.Second), whole.ID)
	require.ErrorIs(t, err, ErrPoisoned)
	var pe *PoisonedError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, whole.ID, pe.EventID)
	require.Contains(t, pe.LastError, "stamp refused")
	require.ErrorContains(t, err, whole.ID.String())
}

func TestAwaitFanoutOfAnEventNeverCommitted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	b.start(t)
	a := startAwaiter(t, b, &AwaiterConfig{NotFoundGrace: 100 * time.Millisecond})
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	e, err := Record(ctx, tx, Event{Type: "a"})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	start := time.Now()
	_, err = a.AwaitFanout(within(t, 30*time.Second), e.ID)
	require.ErrorIs(t, err, ErrNotFound)
	require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "the grace is waited out")

	// Within the grace, a commit that lands late is still seen.
	tx, err = b.pool.Begin(ctx)
	require.NoError(t, err)
	late, err := Record(ctx, tx, Event{Type: "a"})
	require.NoError(t, err)
	a2 := startAwaiter(t, b, &AwaiterConfig{NotFoundGrace: 5 * time.Second})
	result := make(chan error, 1)
	go func() {
		_, err := a2.AwaitFanout(within(t, 30*time.Second), late.ID)
		result <- err
	}()
	require.Eventually(t, func() bool { return a2.waiting() == 1 }, 30*time.Second, time.Millisecond)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-result)
}

func TestAwaitFanoutEndsWithItsContextAndLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**")) // relay never started
	a := startAwaiter(t, b, nil)
	e := b.record(t, Event{Type: "a"})[0]
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := a.AwaitFanout(ctx, e.ID)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Zero(t, a.waiting(), "a cancelled wait left its registration behind")

	_, err = (&Awaiter{}).AwaitFanout(context.Background(), e.ID)
	require.ErrorIs(t, err, ErrNotRunning)
}

// 1,000 concurrent waiters share one listening connection.
func TestThousandWaitersOneConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	a := startAwaiter(t, b, nil)
	es := make([]Event, 1000)
	for i := range es {
		es[i] = Event{Type: "a", Subject: fmt.Sprint(i)}
	}
	es = b.record(t, es...)
	ctx := within(t, 60*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, len(es))
	for _, e := range es {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := a.AwaitFanout(ctx, e.ID)
			if err == nil && len(got[0].Fanout) != 1 {
				err = fmt.Errorf("fanout of %s: %v", e.ID, got[0].Fanout)
			}
			errs <- err
		}()
	}
	require.Eventually(t, func() bool { return a.waiting() == 1000 }, 30*time.Second, 5*time.Millisecond)
	var listeners int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()",
		listener.AwaiterApplicationName).Scan(&listeners))
	require.Equal(t, 1, listeners)
	var backends int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'").Scan(&backends))
	require.LessOrEqual(t, backends, int(b.pool.Config().MaxConns)+1, "waiters do not hold connections")

	b.start(t)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Zero(t, a.waiting())
}

// The awaiter's listener dies while waiters are pending and the fan-out
// happens while it is away: the notification is lost, and the waiters learn
// of the fan-out when the listener is back.
func TestAwaitFanoutSurvivesALostListener(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	// A long grace, so its timer's re-check cannot stand in for the reconnect's.
	a, err := NewAwaiter(b.pool, &AwaiterConfig{Logger: quietLogger(), NotFoundGrace: time.Hour})
	require.NoError(t, err)
	var once sync.Once
	a.reconnectPause = func(ctx context.Context, _ time.Duration) {
		once.Do(func() {
			b.start(t)
			waitFannedOut(t, b.pool, 10*time.Second)
		})
	}
	require.NoError(t, a.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, a.Stop(context.Background())) })

	es := b.record(t, Event{Type: "a"}, Event{Type: "b"})
	ctx := within(t, 20*time.Second)
	results := make(chan error, 2)
	for _, e := range es {
		go func() {
			_, err := a.AwaitFanout(ctx, e.ID)
			results <- err
		}()
	}
	require.Eventually(t, func() bool { return a.waiting() == 2 }, 30*time.Second, time.Millisecond)
	<-a.Ready() // its listening connection exists
	var pid int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()",
		listener.AwaiterApplicationName).Scan(&pid))
	_, err = b.pool.Exec(context.Background(), "SELECT pg_terminate_backend($1)", pid)
	require.NoError(t, err)
	for range es {
		require.NoError(t, <-results)
	}
}

// Cancelling the context given to Start stops the awaiter: waiters are woken
// with ErrNotRunning, and later calls fail at once.
func TestAwaiterStartContextCancelledWakesWaiters(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}) // no relay runs: nothing is ever fanned out
	a, err := NewAwaiter(b.pool, &AwaiterConfig{Logger: quietLogger()})
	require.NoError(t, err)
	startCtx, cancel := context.WithCancel(context.Background())
	require.NoError(t, a.Start(startCtx))
	t.Cleanup(func() { require.NoError(t, a.Stop(context.Background())) })
	e := b.record(t, Event{Type: "a"})[0]

	waitErr := make(chan error)
	go func() {
		_, err := a.AwaitFanout(within(t, 30*time.Second), e.ID)
		waitErr <- err
	}()
	require.Eventually(t, func() bool { return a.waiting() == 1 }, 30*time.Second, time.Millisecond)
	cancel()
	select {
	case err := <-waitErr:
		require.ErrorIs(t, err, ErrNotRunning)
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter was not woken when Start's context was cancelled")
	}
	_, err = a.AwaitFanout(within(t, 30*time.Second), e.ID)
	require.ErrorIs(t, err, ErrNotRunning)
}

// A writer that waits for its receipt wakes the relays itself: with the
// commit's own notification throttled away and the relay polling only
// hourly, the awaiter's kick is the only thing that can make the relay look.
func TestAwaiterKicksTheRelays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{config: &RelayConfig{Listener: ListenerConfig{PollInterval: time.Hour}}}, mapSub("audit", false, "**"))
	a := startAwaiter(t, b, nil)
	b.start(t)
	requireClosed(t, b.relay.Ready(), "relay ready")
	requireClosed(t, a.Ready(), "awaiter ready")
	// Past the relay's re-checks after its first round: from then on it
	// waits for a notification. (Not settle: with hourly polls the relay may
	// be idle already and signal it never again.)
	b.rechecksOver(t)
	var e Event
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		e, err = Outbox{NotifyInterval: NotifyNever}.Record(ctx, tx, Event{Type: "quiet.commit"})
		return err
	}))
	// Without the awaiter's kick the relay would look only at its next
	// hourly poll: any receipt within 30 s was kicked, and only a stall
	// misses that bound.
	start := time.Now()
	receipts, err := a.AwaitFanout(within(t, 30*time.Second), e.ID)
	require.NoError(t, err)
	require.Contains(t, receipts[0].Fanout, "audit")
	t.Logf("receipt in %v", time.Since(start))
}

// The awaiter kicks the relays at once only when a transaction of this
// process may have committed without notifying (Record's throttle refused
// one lately); otherwise only once its events are late (kickAfter), so a
// receipt whose own commit notified costs no second notification.
func TestAwaiterKicksAtOnceOnlyAfterAThrottledNotification(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	// A schema of its own: the throttle's memory is per process and schema,
	// and other tests record in the default one.
	out := Outbox{Schema: "kick_timing"}
	require.NoError(t, out.Migrate(ctx, pool))
	var channel string
	require.NoError(t, pool.QueryRow(ctx, "SELECT channel FROM kick_timing.outbox_settings").Scan(&channel))
	a := startAwaiter(t, &testBundle{pool: pool}, &AwaiterConfig{Outbox: out})
	a.kickAfter = 300 * time.Millisecond
	requireClosed(t, a.Ready(), "awaiter ready")

	conn, err := pgx.Connect(ctx, pool.Config().ConnString())
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	require.NoError(t, err)

	// kickIn records with rec (no relay runs: the event stays pending),
	// waits for its receipt and returns how long after the wait began the
	// first notification that is not the commit's own came.
	kickIn := func(a *Awaiter, rec Outbox) time.Duration {
		var e Event
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			e, err = rec.Record(ctx, tx, Event{Type: "k"})
			return err
		}))
		if rec.NotifyInterval == NotifyEveryTransaction {
			_, err := conn.WaitForNotification(within(t, 30*time.Second)) // the commit's own
			require.NoError(t, err)
		}
		waitCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		start := time.Now()
		go func() { _, _ = a.AwaitFanout(waitCtx, e.ID) }()
		_, err := conn.WaitForNotification(within(t, 3*time.Minute))
		require.NoError(t, err)
		return time.Since(start)
	}

	notified := out
	notified.NotifyInterval = NotifyEveryTransaction
	require.GreaterOrEqual(t, kickIn(a, notified), 300*time.Millisecond, "kicked before the events were late")

	// At once, against an awaiter whose events are late only after two
	// minutes: only a stall reaches a quarter of that.
	patient := startAwaiter(t, &testBundle{pool: pool}, &AwaiterConfig{Outbox: out})
	patient.kickAfter = 2 * time.Minute
	// However slow the machine between the commit and the wait's first
	// look: the refusal counts for the whole test.
	patient.kickAtOnceWithin = time.Hour
	requireClosed(t, patient.Ready(), "awaiter ready")
	quiet := out
	quiet.NotifyInterval = NotifyNever // refused: the commit did not notify
	require.Less(t, kickIn(patient, quiet), 30*time.Second, "did not kick at once after a refused notification")
}

// The awaiter's re-read bounds a receipt even while its listening connection
// is silently dead and not yet noticed: within PollInterval.
func TestReceiptDuringASilentOutageComesWithinThePollInterval(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	u, err := url.Parse(b.url)
	require.NoError(t, err)
	proxy := newBlackholeProxy(t, u.Host)
	a := startAwaiter(t, b, &AwaiterConfig{Listener: ListenerConfig{
		Connect: proxy.connectVia(t, b.url, "awaiter_via_proxy"),
		// The ping would take an hour to notice: only the re-read helps.
		hooks: listenerHooks{pingInterval: time.Hour}, PollInterval: 200 * time.Millisecond,
	}})
	b.start(t)
	b.settle(t)
	requireClosed(t, a.Ready(), "awaiter ready")
	proxy.Blackhole()
	e := b.record(t, Event{Type: "during.silence"})[0]
	start := time.Now()
	receipts, err := a.AwaitFanout(within(t, 30*time.Second), e.ID)
	require.NoError(t, err)
	require.Len(t, receipts, 1)
	took := time.Since(start)
	t.Logf("receipt on a dead listening connection in %v", took)
	// Fifty re-reads' worth: without them it would be the hourly ping.
	require.Less(t, took, 10*time.Second)
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

	rcpt, err := a.AwaitFanout(within(t, 30*time.Second), e.ID)
	require.NoError(t, err)
	require.Contains(t, rcpt[0].Fanout, "fast")
	require.Equal(t, []string{"broken", "flaky"}, rcpt[0].Owed, "answered at fan-out, before the retries")

	rcpt, err = a.AwaitDelivery(within(t, 30*time.Second), "flaky", e.ID)
	require.NoError(t, err)
	require.NotZero(t, rcpt[0].Fanout["flaky"], "waited for the retry that delivered it")
	require.EqualValues(t, 3, flakyCalls.Load())

	_, err = a.AwaitDelivery(within(t, 30*time.Second), "broken", e.ID)
	var pe *PoisonedError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "broken", pe.Subscriber)
	require.Contains(t, pe.LastError, "never")

	note := b.record(t, Event{Type: "note.changed"})[0]
	rcpt, err = a.AwaitDelivery(within(t, 30*time.Second), "flaky", note.ID)
	require.NoError(t, err, "flaky does not take notes: nothing to wait for")
	require.NotContains(t, rcpt[0].Fanout, "flaky")
}
