package events

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/maintenance"
	"github.com/standmeet/events/internal/testdb"
)

// Review: migration 020 decides "empty table, drop it" with EXISTS under the
// transaction's snapshot. Migrate's transactions run at the database's
// default isolation; under REPEATABLE READ (or SERIALIZABLE) the snapshot
// is taken at the migration lock, before LOCK TABLE waits for in-flight
// writers. A writer that commits during that wait is not seen, and its
// table — with the committed event — is dropped.
func TestReviewMigration020DropsARowCommittedDuringItsLockWait(t *testing.T) {
	ctx := context.Background()
	url := testdb.EmptyURL(t)
	pool := testdb.Pool(t, url)
	require.NoError(t, migrate(ctx, pool, outbox, 19))
	var db string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_database()").Scan(&db))
	exec(t, pool, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET default_transaction_isolation = 'repeatable read'")
	migrator := testdb.Pool(t, url) // new connections: REPEATABLE READ by default

	host, err := pool.Begin(ctx)
	require.NoError(t, err)
	e, err := Record(ctx, host, Event{Type: "committed.during.the.swap"})
	require.NoError(t, err)

	migrated := make(chan error, 1)
	go func() { migrated <- outbox.Migrate(ctx, migrator) }()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%LOCK TABLE outbox_events%')`).Scan(&waiting))
		return waiting
	}, 30*time.Second, 2*time.Millisecond, "the migration never waited for the open writer")
	require.NoError(t, host.Commit(ctx))
	select {
	case err := <-migrated:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Migrate never finished")
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE id = $1", e.ID).Scan(&n))
	require.Equal(t, 1, n, "the committed event %s was dropped with outbox_events_legacy", e.ID)
}

// Review: 020 copies the old table's grants but not its owner. When 020 runs
// as another role than the one that owned outbox_events (a DBA or a
// superuser running `events migrate`, a per-deploy user without SET ROLE),
// the new table and its partitions belong to the migrating role and the
// former owner — the role the service records as — has no privilege left.
func TestReviewMigration020LeavesTheFormerOwnerWithoutAccess(t *testing.T) {
	ctx := context.Background()
	url := testdb.EmptyURL(t)
	pool := testdb.Pool(t, url)
	require.NoError(t, migrate(ctx, pool, outbox, 18))
	role := pgx.Identifier{fmt.Sprintf("app_owner_%d", time.Now().UnixNano())}.Sanitize()
	exec(t, pool, "CREATE ROLE "+role+" NOLOGIN")
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "REASSIGN OWNED BY "+role+" TO CURRENT_USER")
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = pool.Exec(context.Background(), "DROP ROLE "+role)
	})
	exec(t, pool, "ALTER TABLE outbox_events OWNER TO "+role)
	exec(t, pool, "GRANT SELECT, UPDATE ON outbox_settings TO "+role)
	exec(t, pool, "INSERT INTO outbox_events (id, type) VALUES (gen_random_uuid(), 'kept')") // a non-empty table: attached
	asOwner := func() error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+role); err != nil {
				return err
			}
			_, err := Record(ctx, tx, Event{Type: "order.placed"})
			return err
		})
	}
	require.NoError(t, asOwner(), "before 020, the owner records")
	require.NoError(t, outbox.Migrate(ctx, pool)) // as another role
	require.NoError(t, asOwner(), "after 020, the former owner of outbox_events cannot record")
}

// Review: the ring's partitions are created with no grants. A relay whose
// role is granted outbox_events (as 020 itself carries over) but does not
// own it cannot read, lock or truncate a partition: every pass logs a
// warning and no partition is ever emptied whole.
func TestReviewRetentionTruncatesAsAGrantedRelayRole(t *testing.T) {
	ctx := context.Background()
	url := testdb.URL(t)
	admin := testdb.Pool(t, url)
	role := pgx.Identifier{fmt.Sprintf("relay_%d", time.Now().UnixNano())}.Sanitize()
	exec(t, admin, "CREATE ROLE "+role+" NOLOGIN")
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = admin.Exec(context.Background(), "DROP ROLE "+role)
	})
	exec(t, admin, "GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON outbox_events, outbox_deliveries TO "+role)
	// Expired rows in a slot that is neither this period's nor the one before.
	exec(t, admin, `INSERT INTO outbox_events (id, type, fanout, fanned_out_at, slot)
		SELECT gen_random_uuid(), 'aged', '{}', now() - interval '2 days', (outbox_slot_of(now()) + 5) % 10
		  FROM generate_series(1, 100)`)

	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET ROLE "+role)
		return err
	}
	relayPool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(relayPool.Close)

	var logs bytes.Buffer
	var emptied []string
	p := &maintenance.Pruner{
		DB: relayPool, SQL: defaultSQL(t), Retention: time.Hour, Interval: time.Minute,
		Logger:     slog.New(slog.NewTextHandler(&logs, nil)),
		OnTruncate: func(part string) { emptied = append(emptied, part) },
	}
	p.Pass(ctx, make(chan struct{}))
	t.Logf("logs: %s", logs.String())
	require.NotEmpty(t, emptied, "no partition emptied by a relay granted outbox_events")
}
