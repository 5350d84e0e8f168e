package events

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/statements"
	"github.com/standmeet/events/internal/testdb"
)

// A named schema whose name needs quoting (upper case) works like a
// lower-case one: every statement, the channels, the watch triggers.
func TestAMixedCaseSchemaEndToEnd(t *testing.T) {
	t.Parallel()
	exerciseAll(t, testdb.Pool(t, testdb.EmptyURL(t)), "Billing_EU", ListenerConfig{PollInterval: time.Hour})
}

// The Outbox accepts exactly the schema names a River client accepts: one
// Migrate creates but no River client can use (River keeps 63 bytes for
// "<schema>.<its longest channel>") is refused up front, not after the
// schema is created.
func TestOutboxSchemaLengthIsRiversLimit(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t, testdb.URL(t))
	for _, n := range []int{46, 47, 63} {
		schema := "s" + strings.Repeat("x", n-1)
		_, riverErr := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: schema, Logger: quietLogger()})
		err := Outbox{Schema: schema}.Validate()
		if riverErr != nil {
			require.ErrorIs(t, err, ErrInvalidConfig, "%d bytes: River refuses it (%v), the Outbox must too", n, riverErr)
		} else {
			require.NoError(t, err, "%d bytes", n)
		}
	}
	// A schema at River's limit works end to end, its channels hashed.
	exerciseAll(t, testdb.Pool(t, testdb.EmptyURL(t)), "S"+strings.Repeat("x", 45), ListenerConfig{PollInterval: time.Hour})
}

// Every public function works in every pgx query exec mode (the usual
// settings behind PgBouncer are exec and simple protocol).
func TestEveryFunctionInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	for name, mode := range execModes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			exerciseAll(t, poolInMode(t, testdb.EmptyURL(t), mode), "", ListenerConfig{PollInterval: 50 * time.Millisecond})
		})
	}
}

// The quickstart's flow, and every public function, through a real PgBouncer
// in transaction pooling mode, with the exec modes used behind it (PgBouncer
// 1.18 keeps no prepared statements in this mode), and the relay and awaiter
// either polling only or listening on a direct connection.
func TestThroughPgBouncerInTransactionMode(t *testing.T) {
	t.Parallel()
	bouncer := testdb.PgBouncer(t)
	for name, mode := range map[string]pgx.QueryExecMode{"exec": pgx.QueryExecModeExec, "simple protocol": pgx.QueryExecModeSimpleProtocol} {
		t.Run(name+", poll only", func(t *testing.T) {
			t.Parallel()
			pool := poolInMode(t, bouncer.URL(testdb.EmptyURL(t)), mode)
			requireThroughBouncer(t, pool)
			exerciseAll(t, pool, "", ListenerConfig{PollOnly: true, PollInterval: 50 * time.Millisecond})
		})
		t.Run(name+", listening directly", func(t *testing.T) {
			t.Parallel()
			direct := testdb.EmptyURL(t)
			pool := poolInMode(t, bouncer.URL(direct), mode)
			requireThroughBouncer(t, pool)
			exerciseAll(t, pool, "app", ListenerConfig{PollInterval: time.Hour,
				Connect: func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, direct) }})
		})
	}
}

// Raising outbox_settings.notify_interval (the README's knob) must not
// silence the SQL paths' notifications: the throttle allows one per
// interval, not none. The slot number is the time divided by the interval,
// so going from 1 ms to 1 s makes every new slot a thousand times smaller
// than the one last taken, and outbox_notify() never notifies again (for
// about fifty thousand years).
func TestRaisingTheNotifyIntervalKeepsSQLNotificationsComing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	exec(t, b.pool, "UPDATE outbox_settings SET notify_interval = '1 millisecond'")
	exec(t, b.pool, "SELECT outbox_record('warm.up')")
	exec(t, b.pool, "UPDATE outbox_settings SET notify_interval = '1 second'")

	conn := listenEvents(t, b.url)
	got := false
	deadline := time.Now().Add(5 * time.Second) // five whole intervals
	for !got && time.Now().Before(deadline) {
		_, err := b.pool.Exec(ctx, "SELECT outbox_record('after.the.change')")
		require.NoError(t, err)
		got = notified(conn, 100*time.Millisecond)
	}
	require.True(t, got, "no SQL-side notification in five intervals of 1 s after notify_interval went from 1 ms to 1 s")
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
	_, err = conn.Exec(ctx, "LISTEN "+statements.ChannelEvents)
	require.NoError(t, err)
	for range 3 {
		exec(t, b.pool, "SELECT outbox_record('a')")
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := conn.WaitForNotification(wctx)
		cancel()
		require.NoError(t, err)
	}
}

var execModes = map[string]pgx.QueryExecMode{
	"cache statement": pgx.QueryExecModeCacheStatement,
	"cache describe":  pgx.QueryExecModeCacheDescribe,
	"describe exec":   pgx.QueryExecModeDescribeExec,
	"exec":            pgx.QueryExecModeExec,
	"simple protocol": pgx.QueryExecModeSimpleProtocol,
}

// exerciseAll runs the quickstart's flow and every public function on pool,
// a fresh database; schema is passed to Migrate and the Outbox, listen to
// the relay and the awaiter.
func exerciseAll(t *testing.T, pool *pgxpool.Pool, schema string, listen ListenerConfig) {
	t.Helper()
	ctx := context.Background()
	o := Outbox{Schema: schema}
	require.NoError(t, Outbox{Schema: schema}.Migrate(ctx, pool))
	require.NoError(t, Outbox{Schema: schema}.Migrate(ctx, pool), "twice")

	var fail = true
	broken := Subscriber{Name: "broken", Types: []string{"broken.*"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			if fail {
				return nil, nil, errors.New("no template")
			}
			return testArgs{EventID: e.ID}, nil, nil
		}}
	relay, err := NewRelay(pool, &RelayConfig{Outbox: o, MaxAttempts: 1, Logger: quietLogger(), Listener: listen})
	require.NoError(t, err)
	require.NoError(t, relay.Subscribe(mapSub("audit", false, "**")))
	require.NoError(t, relay.Subscribe(mapSub("search", true, "note.*")))
	require.NoError(t, relay.Subscribe(broken))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: schema, Logger: quietLogger()})
	require.NoError(t, err)

	// Recording, and a transaction's own events.
	var recorded []Event
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		one, err := o.Record(ctx, tx, Event{Type: "note.changed", Subject: "note:1", Payload: []byte(`{"a":1}`)})
		if err != nil {
			return err
		}
		many, err := o.RecordMany(ctx, tx, []Event{{Type: "note.changed", Subject: "note:1"}, {Type: "order.placed"}})
		if err != nil {
			return err
		}
		mine, err := o.RecordedInTx(ctx, tx)
		if err != nil {
			return err
		}
		if len(mine) != 3 {
			return fmt.Errorf("RecordedInTx: %d events", len(mine))
		}
		recorded = append([]Event{one}, many...)
		return nil
	}))

	// A watch.
	_, err = pool.Exec(ctx, "CREATE TABLE watched (id int PRIMARY KEY, title text)")
	require.NoError(t, err)
	w := Watch{Table: "watched", Types: map[Op]string{OpInsert: "watched.created"}, Payload: PayloadRow}
	require.NoError(t, o.InstallWatch(ctx, pool, w))
	require.NoError(t, o.InstallWatch(ctx, pool, w), "unchanged")
	_, err = pool.Exec(ctx, "INSERT INTO watched VALUES (1, 'x')")
	require.NoError(t, err)

	// Synchronous fan-out in a transaction, rolled back.
	require.ErrorIs(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		n, err := relay.FanoutTx(ctx, tx, client)
		if err == nil && n != 4 {
			err = fmt.Errorf("FanoutTx claimed %d", n)
		}
		if err == nil {
			err = errRollback
		}
		return err
	}), errRollback)

	// The relay, receipts, a poisoned event, operators.
	awaiter, err := NewAwaiter(pool, &AwaiterConfig{Outbox: Outbox{Schema: schema}, Logger: quietLogger(), Listener: listen})
	require.NoError(t, err)
	require.NoError(t, awaiter.Start(ctx))
	defer awaiter.Stop(ctx)
	require.NoError(t, relay.Start(ctx, client))
	defer relay.Stop(ctx)
	receipts, err := awaiter.AwaitFanout(within(t, 20*time.Second), recorded[0].ID, recorded[1].ID, recorded[2].ID)
	require.NoError(t, err)
	require.Equal(t, receipts[0].Fanout["search"], receipts[1].Fanout["search"], "coalesced")

	var bad Event
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		bad, err = o.Record(ctx, tx, Event{Type: "broken.thing"})
		return err
	}))
	rcpt, err := awaiter.AwaitFanout(within(t, 20*time.Second), bad.ID)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"broken": `subscriber "broken": Map: no template`}, rcpt[0].Poisoned,
		"MaxAttempts 1: poisoned for broken alone at once")
	require.Contains(t, rcpt[0].Fanout, "audit")
	dl, err := o.ListDeliveries(ctx, pool, ListDeliveriesParams{State: DeliveryPoisoned, Type: "broken.*", Subscriber: "broken", Limit: 1})
	require.NoError(t, err)
	require.Len(t, dl.Deliveries, 1)
	require.Len(t, dl.Deliveries[0].Errors, 1)
	dl, err = o.ListDeliveries(ctx, pool, ListDeliveriesParams{State: DeliveryPoisoned, After: fmt.Sprintf("%d.broken", dl.Deliveries[0].Seq)})
	require.NoError(t, err)
	require.Empty(t, dl.Deliveries, "keyset page after a cursor")
	// An event poisoned as a whole (its stamp could not be written), by
	// hand: receipts and the event lists report it.
	var whole Event
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		whole, err = o.Record(ctx, tx, Event{Type: "whole.thing"})
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "UPDATE "+qualified(schema, "outbox_events")+" SET poisoned_at = now(), attempts = 1, last_error = 'x' WHERE id = $1", whole.ID)
		return err
	}))
	_, err = awaiter.AwaitFanout(within(t, 20*time.Second), whole.ID)
	var pe *PoisonedError
	require.ErrorAs(t, err, &pe)
	page, err := o.ListEvents(ctx, pool, ListEventsParams{State: EventPoisoned, Limit: 1})
	require.NoError(t, err)
	require.Len(t, page.Events, 1)
	page, err = o.ListEvents(ctx, pool, ListEventsParams{State: EventPoisoned, Limit: 1, After: fmt.Sprintf("%d.%d", time.Now().Add(time.Hour).UnixMicro(), 1<<40)})
	require.NoError(t, err)
	require.Len(t, page.Events, 1, "keyset page after a cursor")
	n, err := o.Discard(ctx, pool, PoisonedFilter{EventIDs: []uuid.UUID{whole.ID}})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	n, err = o.Discard(ctx, pool, PoisonedFilter{Type: "nothing.*"})
	require.NoError(t, err)
	require.Zero(t, n)
	require.NoError(t, o.PauseSubscriber(ctx, pool, "search"))
	require.NoError(t, o.ResumeSubscriber(ctx, pool, "search"))
	fail = false
	n, err = o.Requeue(ctx, pool, PoisonedFilter{EventIDs: []uuid.UUID{bad.ID}})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Eventually(t, func() bool {
		info, err := o.GetEvent(ctx, pool, bad.ID)
		require.NoError(t, err)
		return info.Fanout["broken"] != 0 && len(info.Deliveries) == 0
	}, 20*time.Second, 10*time.Millisecond)
	n, err = o.Requeue(ctx, pool, PoisonedFilter{Subscriber: "broken"})
	require.NoError(t, err)
	require.Zero(t, n)
	st, err := o.GetStats(ctx, pool)
	require.NoError(t, err)
	require.Zero(t, st.PoisonedDeliveries)
	bf, err := o.BackfillSubscriber(ctx, pool, "broken", time.Now().Add(-time.Hour))
	require.NoError(t, err)
	require.Zero(t, bf.Owed, "broken has every broken.* event already")
	relays, err := o.ListRelays(ctx, pool)
	require.NoError(t, err)
	require.Len(t, relays, 1)

	subs, err := o.ListSubscribers(ctx, pool)
	require.NoError(t, err)
	require.Len(t, subs, 3)
	require.NoError(t, o.RetireSubscriber(ctx, pool, "broken"))
	require.NoError(t, o.RemoveWatch(ctx, pool, "", "watched", ""))
}

// requireThroughBouncer checks that pool reaches PostgreSQL through a proxy:
// the server's port is not the one the pool dials.
func requireThroughBouncer(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var serverPort int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT inet_server_port()").Scan(&serverPort))
	require.NotEqual(t, int(pool.Config().ConnConfig.Port), serverPort, "the pool reaches PostgreSQL through PgBouncer")
}

// qualified names a library table in schema ("" for the search_path).
func qualified(schema, table string) string {
	if schema == "" {
		return table
	}
	return pgx.Identifier{schema, table}.Sanitize()
}
