package events

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

// previousRelease is the library's schema version of the last release
// (0.1.0): upgrades start from it.
const previousRelease = 3

// The previous release's binaries keep working on the migrated schema, so a
// deploy can migrate first and roll out after: every statement 0.1.0 sends
// (kept in testdata, as that release built them) still prepares — its
// tables, columns and functions all exist with the types it expects — and
// its write path still records.
func TestPreviousReleaseStatementsWorkOnTheMigratedSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	raw, err := os.ReadFile("testdata/v0.1.0_statements.json")
	require.NoError(t, err)
	var stmts map[string]string
	require.NoError(t, json.Unmarshal(raw, &stmts))
	names := make([]string, 0, len(stmts))
	for name := range stmts {
		names = append(names, name)
	}
	sort.Strings(names)
	conn, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	prepared := 0
	for _, name := range names {
		if slices.Contains([]string{"Schema", "ChannelEvents", "ChannelFanned", "WatchFunction"}, name) {
			continue
		}
		_, err := conn.Conn().Prepare(ctx, "v010_"+strings.ReplaceAll(name, ".", "_"), stmts[name])
		require.NoError(t, err, "0.1.0's %s no longer prepares on the migrated schema", name)
		prepared++
	}
	require.Greater(t, prepared, 30)
	// And 0.1.0's Record, run as it ran it.
	var seq int64
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, stmts["RecordNotify"], "0194f1c6-7d6a-7000-8000-000000000001", "old.release", "", "{}", nil, "").Scan(&seq, new(time.Time))
	}))
	require.Positive(t, seq)
}

// Migrate from the previous release runs while writers record: on a table of
// a million rows, with 16 writers, no Record waits on the migration for more
// than an instant. (0.1.0's own migration held the table's lock while it
// built an index: writers stalled for a second and more.)
func TestMigrateFromThePreviousReleaseWhileWritersRecord(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("loads a million rows: run without -short (CI does)")
	}
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.EmptyURL(t))
	require.NoError(t, migrate(ctx, pool, outbox, previousRelease))
	exec(t, pool, `INSERT INTO outbox_events (id, type, fanned_out_at, fanout, created_at)
		SELECT gen_random_uuid(), 'bulk', now() - g * interval '1 second', '{}', now() - interval '1 day'
		  FROM generate_series(1, 1000000) g`)
	exec(t, pool, "ANALYZE outbox_events")

	var (
		mu                 sync.Mutex
		before, during     time.Duration // longest Record + commit, before and while Migrate runs
		migrating, stopped = make(chan struct{}), make(chan struct{})
		wg                 sync.WaitGroup
		recorded           int
	)
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-stopped:
					return
				default:
				}
				inMigration := false
				select {
				case <-migrating:
					inMigration = true
				default:
				}
				start := time.Now()
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					// 0.1.0's columns only: the writer is the previous
					// release, still running while the schema moves on.
					_, err := tx.Exec(ctx, "INSERT INTO outbox_events (id, type) VALUES (gen_random_uuid(), 'during.migration')")
					return err
				})
				took := time.Since(start)
				mu.Lock()
				recorded++
				if inMigration {
					during = max(during, took)
				} else {
					before = max(before, took)
				}
				mu.Unlock()
				if err != nil {
					t.Errorf("a writer failed during the migration: %v", err)
					return
				}
			}
		})
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return recorded }
	// A stretch of writes before, as the baseline.
	require.Eventually(t, func() bool { return count() >= 500 }, 30*time.Second, time.Millisecond)
	close(migrating)
	start := time.Now()
	require.NoError(t, outbox.Migrate(ctx, pool))
	took := time.Since(start)
	// And writes right after it.
	after := count()
	require.Eventually(t, func() bool { return count() >= after+200 }, 30*time.Second, time.Millisecond)
	close(stopped)
	wg.Wait()
	var version int
	require.NoError(t, pool.QueryRow(ctx, "SELECT max(version) FROM outbox_migration").Scan(&version))
	files, err := loadMigrations()
	require.NoError(t, err)
	require.Equal(t, files[len(files)-1].version, version)
	t.Logf("Migrate from %d took %v; %d transactions; longest write before %v, during and after %v",
		previousRelease, took, recorded, before, during)
	require.Less(t, during, max(500*time.Millisecond, 3*before),
		"a writer stalled behind the migration")
}
