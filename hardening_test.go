package events

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

// Review of issue 18: findings against the sequence-slot throttle, the
// liveness changes and the loop's backoff.

// listenEvents opens a connection of its own that LISTENs on the default
// schema's events channel.
func listenEvents(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	sql, err := statementsFor("")
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{sql.ChannelEvents}.Sanitize())
	require.NoError(t, err)
	return conn
}

// notified waits up to d for a notification on conn.
func notified(conn *pgx.Conn, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_, err := conn.WaitForNotification(ctx)
	return err == nil
}

// A host role with the privileges 0.1.0 needed for the SQL write paths
// (INSERT and SELECT on outbox_events, SELECT and UPDATE on outbox_settings)
// keeps writing after Migrate: the migration must not make the host's own
// transactions fail. Migration 004's throttle reads and sets the sequence
// outbox_notify_slot inside the host's transaction, as the host's role, and
// nothing grants that role the sequence: every outbox_record() and every
// write to a watched table fails with "permission denied for sequence".
func TestLeastPrivilegedHostRoleKeepsWritingAfterMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.EmptyURL(t)
	pool := testdb.Pool(t, url)
	require.NoError(t, migrate(ctx, pool, outbox, previousRelease))

	role := fmt.Sprintf("host_app_%d", time.Now().UnixNano())
	ident := pgx.Identifier{role}.Sanitize()
	exec(t, pool, "CREATE ROLE "+ident+" NOLOGIN")
	t.Cleanup(func() {
		// Roles are cluster-wide: remove this one's grants, then the role.
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+ident)
		_, _ = pool.Exec(context.Background(), "DROP ROLE "+ident)
	})
	exec(t, pool, "GRANT INSERT, SELECT ON outbox_events TO "+ident)
	exec(t, pool, "GRANT SELECT, UPDATE ON outbox_settings TO "+ident)
	exec(t, pool, "CREATE TABLE orders (id int PRIMARY KEY, note text NOT NULL DEFAULT '')")
	exec(t, pool, "GRANT SELECT, INSERT, UPDATE ON orders TO "+ident)

	asHost := func(f func(tx pgx.Tx) error) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+ident); err != nil {
				return err
			}
			return f(tx)
		})
	}
	sqlRecord := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT outbox_record('order.placed', 'order:1')")
		return err
	}
	require.NoError(t, asHost(sqlRecord), "the previous release: the host role records from SQL")

	require.NoError(t, outbox.Migrate(ctx, pool))
	require.NoError(t, outbox.InstallWatch(ctx, pool, Watch{Table: "orders", Types: map[Op]string{OpInsert: "order.created"}}))

	require.NoError(t, asHost(sqlRecord), "after Migrate: outbox_record() as the host role")
	require.NoError(t, asHost(func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO orders (id) VALUES (1)")
		return err
	}), "after Migrate: a write to a watched table as the host role")
	require.NoError(t, asHost(func(tx pgx.Tx) error {
		_, err := Record(ctx, tx, Event{Type: "order.placed"})
		return err
	}), "after Migrate: Record as the host role")
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

// The throttle's trade-off, bounded: a transaction (or savepoint) that took
// the notify interval and then rolled back sent nothing, and the interval
// stays taken (sequences do not roll back), so a transaction that commits in
// the same interval sends no notification either. Its event is still fanned
// out within the relay's poll interval: the relays never depend on the
// notification. (Under 0.1.0 the claim rolled back with the transaction, at
// the price of failing REPEATABLE READ writers.)
func TestARolledBackNotifyDelaysCommittedOnesAtMostAPoll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, how := range []string{"transaction", "savepoint"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			const poll = 300 * time.Millisecond
			b := setup(t, setupOpts{config: &RelayConfig{Listener: ListenerConfig{PollInterval: poll}}}, mapSub("audit", false, "**"))
			// One notification an hour: none has been sent this hour.
			exec(t, b.pool, "UPDATE outbox_settings SET notify_interval = '1 hour'")
			conn := listenEvents(t, b.url)
			b.start(t)
			b.settle(t)
			var id string
			require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				if how == "transaction" {
					inner, err := b.pool.Begin(ctx)
					if err != nil {
						return err
					}
					if _, err := inner.Exec(ctx, "SELECT outbox_record('rolled.back')"); err != nil {
						return err
					}
					if err := inner.Rollback(ctx); err != nil {
						return err
					}
				} else {
					if _, err := tx.Exec(ctx, "SAVEPOINT s"); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, "SELECT outbox_record('rolled.back')"); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT s"); err != nil {
						return err
					}
				}
				return tx.QueryRow(ctx, "SELECT outbox_record('committed')::text").Scan(&id)
			}))
			committed := time.Now()
			require.False(t, notified(conn, 50*time.Millisecond), "the interval was taken: no notification (if this fails, the trade-off is gone: update the README)")
			require.Eventually(t, func() bool {
				var fanned bool
				require.NoError(t, b.pool.QueryRow(ctx, "SELECT fanned_out_at IS NOT NULL FROM outbox_events WHERE id = $1", id).Scan(&fanned))
				return fanned
			}, 5*time.Second, 5*time.Millisecond)
			took := time.Since(committed)
			t.Logf("fanned out %v after its quiet commit (%s)", took, how)
			require.Less(t, took, poll+500*time.Millisecond, "a quiet commit waits at most about a poll interval")
		})
	}
}
