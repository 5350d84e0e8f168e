package events

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

// fannedWithin waits until e is fanned out, failing after d.
func fannedWithin(t *testing.T, b *testBundle, id uuid.UUID, d time.Duration, msg string) time.Duration {
	t.Helper()
	start := time.Now()
	require.Eventually(t, func() bool { return loadRows(t, b.pool)[id].FannedOut }, d, 2*time.Millisecond, msg)
	return time.Since(start)
}

// With polling out of the picture (an hour, and the re-checks after the
// first round over), the notification that Record sends is what wakes the
// idle relay.
func TestNotificationWakesTheRelay(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{config: &RelayConfig{Listener: ListenerConfig{PollInterval: time.Hour}}}, mapSub("audit", false, "**"))
	b.start(t)
	b.quiesce(t)
	var e Event
	require.NoError(t, pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		var err error
		e, err = Outbox{NotifyInterval: NotifyEveryTransaction}.Record(context.Background(), tx, Event{Type: "note.changed"})
		return err
	}))
	fannedWithin(t, b, e.ID, 30*time.Second, "the notification did not wake the relay")
}

// A row inserted by plain SQL, with no notification at all, is found by the
// idle relay's poll.
func TestPollingFindsRowsWithoutANotification(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{config: &RelayConfig{Listener: ListenerConfig{PollInterval: 200 * time.Millisecond}}}, mapSub("audit", false, "**"))
	b.start(t)
	b.settle(t)
	for range 3 {
		id := uuid.Must(uuid.NewV7())
		_, err := b.pool.Exec(ctx, "INSERT INTO outbox_events (id, type) VALUES ($1, 'note.silent')", id)
		require.NoError(t, err)
		took := fannedWithin(t, b, id, 2*time.Second, "a silent row was not found by polling")
		t.Logf("found after %v (poll interval 200ms)", took)
	}
}

// Worst case: with notifications switched off entirely, every event is
// fanned out within the poll interval (plus generous slack for a loaded
// machine).
func TestWithoutNotificationsEveryEventIsFannedOutWithinThePollInterval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const poll = 300 * time.Millisecond
	b := setup(t, setupOpts{config: &RelayConfig{Listener: ListenerConfig{PollInterval: poll}}}, mapSub("audit", false, "**"))
	b.start(t)
	b.settle(t)
	silent := Outbox{NotifyInterval: NotifyNever}
	var worst time.Duration
	for i := range 10 {
		var e Event
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			e, err = silent.Record(ctx, tx, Event{Type: "a"})
			return err
		}))
		worst = max(worst, fannedWithin(t, b, e.ID, poll+time.Second, "not fanned out within the poll interval"))
		time.Sleep(time.Duration(i*37%300) * time.Millisecond) // spread over the poll phase
	}
	t.Logf("worst commit-to-fanned without notifications: %v (poll interval %v)", worst, poll)
}

// A transaction whose notification was throttled (another one notified just
// before it) is fanned out by the re-checks, within milliseconds,
// not at the next poll (an hour here).
func TestThrottledTransactionsAreFannedOutByTheRechecks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{config: &RelayConfig{Listener: ListenerConfig{PollInterval: time.Hour}}}, mapSub("audit", false, "**"))
	b.start(t)
	b.settle(t)
	throttled := Outbox{NotifyInterval: NotifyNever} // as if the limiter kept it quiet
	quiet := make(chan Event, 1)
	var once sync.Once
	b.relay.hooks.idle = func() {
		// The relay has drained what the notification announced; now a
		// transaction that the limiter keeps quiet commits.
		once.Do(func() {
			var e Event
			require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				var err error
				e, err = throttled.Record(ctx, tx, Event{Type: "quiet"})
				return err
			}))
			quiet <- e
		})
	}
	var first Event
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		first, err = Outbox{NotifyInterval: NotifyEveryTransaction}.Record(ctx, tx, Event{Type: "loud"})
		return err
	}))
	fannedWithin(t, b, first.ID, 30*time.Second, "the notified event")
	e := <-quiet
	took := fannedWithin(t, b, e.ID, 2*time.Second, "the throttled event waited for the poll")
	t.Logf("throttled event fanned out %v after its commit", took)
}

// A watched table written by 16 concurrent transactions sends no
// notification, even with the SQL throttle at 0 (every outbox_record()
// notifies then), and every event is fanned out: the relay finds the rows by
// its re-checks and polls.
func TestWatchedTableWritesSendNoNotification(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	createNotes(t, b.pool, 16)
	require.NoError(t, outbox.InstallWatch(ctx, b.pool, Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed"}}))
	exec(t, b.pool, "UPDATE outbox_settings SET notify_interval = '0'")
	// The generic trigger function too, as a role that may not create
	// functions in the outbox's schema installs it.
	exec(t, b.pool, `CREATE TABLE corpus_generic (id int PRIMARY KEY, title text NOT NULL);
		INSERT INTO corpus_generic SELECT g, 't' FROM generate_series(1, 16) g;
		CREATE TRIGGER outbox_watch_events_update AFTER UPDATE ON corpus_generic FOR EACH ROW
		  EXECUTE FUNCTION outbox_watch('generic.changed', 'generic:', 'id', 'none', '', '')`)

	conn, err := pgx.Connect(ctx, b.url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "LISTEN "+ChannelEvents)
	require.NoError(t, err)

	b.start(t)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "UPDATE corpus_notes SET title = title || '!' WHERE id = $1", i+1); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, "UPDATE corpus_generic SET title = title || '!' WHERE id = $1", i+1)
				return err
			}))
		}()
	}
	close(start)
	wg.Wait()
	waitFannedOut(t, b.pool, 10*time.Second)
	require.Len(t, eventsOfType(t, b.pool, "note.changed"), 16)
	require.Len(t, eventsOfType(t, b.pool, "generic.changed"), 16)

	// Control: the listener hears what outbox_record() sends.
	exec(t, b.pool, "SELECT outbox_record('control')")
	notifications := 0
	for {
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			break
		}
		notifications++
	}
	require.Equal(t, 1, notifications, "16 watched-table transactions and one outbox_record(): only outbox_record() notifies")
}

// A watched table's writes wake no relay, so the relay looks again after
// activity: every 2 ms at first, then with a gap that doubles with every
// look that finds nothing. A write after a lull of g is found within
// about 2g, however long PollInterval is (an hour here).
func TestTriggerWritesAreFoundByTheRechecks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{config: &RelayConfig{Listener: ListenerConfig{PollInterval: time.Hour}}}, mapSub("audit", false, "**"))
	createNotes(t, b.pool, 1)
	require.NoError(t, outbox.InstallWatch(ctx, b.pool, Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed"}}))
	b.start(t)
	b.settle(t)
	first := b.record(t, Event{Type: "loud"})[0] // notified: the relay is active
	fannedWithin(t, b, first.ID, 30*time.Second, "the notified event")
	for _, lull := range []time.Duration{0, 20 * time.Millisecond, 100 * time.Millisecond, 300 * time.Millisecond} {
		time.Sleep(lull) // the lull between two writes is what is measured, not a wait for a condition
		var id uuid.UUID
		exec(t, b.pool, "UPDATE corpus_notes SET title = title || '!' WHERE id = 1")
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT id FROM outbox_events WHERE type = 'note.changed' ORDER BY seq DESC LIMIT 1").Scan(&id))
		took := fannedWithin(t, b, id, 2*lull+2*time.Second, "a watched-table write after a lull waited for the hourly poll")
		t.Logf("after a lull of %v: fanned out %v after its commit", lull, took)
	}
}

// The re-checks slow down when nothing comes: after one event, about
// twenty looks in the next second (every 2 ms for 16 ms, then doubling) and
// none after, with PollInterval an hour. The same with a pending row that
// another session holds locked (a relay of another process stuck
// mid-round, or a host's FanOutTx in a long transaction): every look sees
// it and every claim skips it, and before a claim that found nothing
// counted as an empty look, the relay re-checked every 2 ms for as long as
// the lock lasted (537-695 looks in 2 s).
func TestTheRechecksSlowDownWhenIdle(t *testing.T) {
	t.Parallel()
	for _, locked := range []bool{false, true} {
		name := map[bool]string{false: "nothing pending", true: "a pending row held locked"}[locked]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{config: &RelayConfig{Listener: ListenerConfig{PollInterval: time.Hour}}}, mapSub("audit", false, "**"))
			var polls atomic.Int64
			b.relay.hooks.polled = func() { polls.Add(1) }
			b.start(t)
			b.quiesce(t)
			if locked {
				holdAPendingRow(t, b)
			}
			e := b.record(t, Event{Type: "loud"})[0]
			fannedWithin(t, b, e.ID, 30*time.Second, "the notified event")
			before := polls.Load()
			time.Sleep(3 * time.Second) // a window to count the looks in
			looks := polls.Load() - before
			t.Logf("%d looks in the 3 s after an event", looks)
			require.GreaterOrEqual(t, looks, int64(5), "the relay looks again after activity")
			require.LessOrEqual(t, looks, int64(30), "the looks thin out: every 2 ms for 16 ms, then 4 ms, 8 ms, … 512 ms, then the poll interval")
		})
	}
}

// With the SQL throttle at 0, every writing transaction notifies (the
// setting is honoured both ways).
func TestSQLThrottleZeroNotifiesEveryTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	exec(t, b.pool, "UPDATE outbox_settings SET notify_interval = '0'")
	conn, err := pgx.Connect(ctx, b.url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "LISTEN "+ChannelEvents)
	require.NoError(t, err)
	for range 3 {
		exec(t, b.pool, "SELECT outbox_record('a')")
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := conn.WaitForNotification(wctx)
		cancel()
		require.NoError(t, err)
	}
}

// PollOnly: a relay and an awaiter with no listening connection at all (as
// behind a transaction-pooling proxy) still fan out and answer receipts.
func TestPollOnlyRelayAndAwaiter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	poll := ListenerConfig{PollOnly: true, PollInterval: 50 * time.Millisecond}
	b := setup(t, setupOpts{config: &RelayConfig{Listener: poll}}, mapSub("audit", false, "**"))
	b.start(t)
	a := startAwaiter(t, b, &AwaiterConfig{Listener: poll})
	requireClosed(t, b.relay.Ready(), "PollOnly relay ready")
	requireClosed(t, a.Ready(), "PollOnly awaiter ready")
	es := b.record(t, Event{Type: "a"}, Event{Type: "b"})
	receipts, err := a.AwaitFanout(within(t, 10*time.Second), es[0].ID, es[1].ID)
	require.NoError(t, err)
	require.Len(t, receipts[1].Fanout, 1)
	var listeners int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND query LIKE 'LISTEN%'`).Scan(&listeners))
	require.Zero(t, listeners, "PollOnly opens no listening connection")
}

// Listener.Connect opens the listening connection (a direct one, while the
// pool goes through a proxy).
func TestListenerConnectFunc(t *testing.T) {
	t.Parallel()
	var connects atomic.Int32
	b := setup(t, setupOpts{config: &RelayConfig{Listener: ListenerConfig{PollInterval: time.Hour}}}, mapSub("audit", false, "**"))
	b.relay.config.Listener.Connect = func(ctx context.Context) (*pgx.Conn, error) {
		connects.Add(1)
		return pgx.Connect(ctx, b.url)
	}
	b.start(t)
	// Past the re-checks that follow the listener's connect (about a
	// second): from then on only a notification on the connection Connect
	// made can make the relay look (it polls hourly).
	b.quiesce(t)
	require.Equal(t, int32(1), connects.Load())
	var e Event
	require.NoError(t, pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		var err error
		e, err = Outbox{NotifyInterval: NotifyEveryTransaction}.Record(context.Background(), tx, Event{Type: "a"})
		return err
	}))
	fannedWithin(t, b, e.ID, 30*time.Second, "the connection Connect made did not carry the notification")
}

// A relay of a schema of its own (one whose name needs quoting) listens on
// that schema's channel: with polls an hour apart and its re-checks over,
// the notification Record sends in that schema is what wakes it.
func TestARelayOfASchemaIsWokenOnItsChannel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.EmptyURL(t))
	o := Outbox{Schema: "Billing_EU"}
	require.NoError(t, o.Migrate(ctx, pool))
	relay, err := NewRelay(pool, &RelayConfig{Outbox: o, Logger: quietLogger(), Listener: ListenerConfig{PollInterval: time.Hour}})
	require.NoError(t, err)
	b := &testBundle{relay: relay, pool: pool, idle: make(chan struct{}, 1)}
	relay.hooks.idle = func() {
		select {
		case b.idle <- struct{}{}:
		default:
		}
	}
	require.NoError(t, relay.Subscribe(mapSub("audit", false, "**")))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: o.Schema, Logger: quietLogger()})
	require.NoError(t, err)
	require.NoError(t, relay.Start(ctx, client))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, relay.Stop(sctx))
	})
	b.quiesce(t)

	var e Event
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		e, err = Outbox{Schema: o.Schema, NotifyInterval: NotifyEveryTransaction}.Record(ctx, tx, Event{Type: "a"})
		return err
	}))
	require.Eventually(t, func() bool {
		info, err := o.Inspect(ctx, pool, e.ID)
		require.NoError(t, err)
		return !info.FannedOutAt.IsZero()
	}, 5*time.Second, 2*time.Millisecond, "the schema's notification did not wake its relay")
}
