package events

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

func TestMigrateConcurrentlyAndTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.EmptyURL(t))
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = outbox.Migrate(ctx, pool)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, outbox.Migrate(ctx, pool))
	var versions int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox_migration").Scan(&versions))
	files, err := loadMigrations()
	require.NoError(t, err)
	require.Equal(t, len(files), versions)
	var riverVersions int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM river_migration").Scan(&riverVersions))
	require.Positive(t, riverVersions)
}

// The SQL files stand on their own, for teams using their own migration tool:
// every down undoes its up.
func TestMigrationFilesGoDownAndUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	files, err := loadMigrations()
	require.NoError(t, err)
	for i := len(files) - 1; i >= 0; i-- {
		require.NotEmpty(t, files[i].down, "version %d has no down file", files[i].version)
		_, err := pool.Exec(ctx, files[i].down)
		require.NoError(t, err)
	}
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass('outbox_events') IS NOT NULL").Scan(&exists))
	require.False(t, exists)
	for _, f := range files {
		_, err := pool.Exec(ctx, f.up)
		require.NoError(t, err)
	}
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass('outbox_events') IS NOT NULL").Scan(&exists))
	require.True(t, exists)
}

func TestMigrateRefusesABadSchema(t *testing.T) {
	t.Parallel()
	err := Outbox{Schema: "bad-name"}.Migrate(context.Background(), testdb.New(t))
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.Contains(t, err.Error(), "Schema")
}

// Version 10 takes the notification out of the watch functions installed
// before it (each watch's own, and the generic one) and its down puts it
// back; both ways the triggers record the same rows.
func TestMigration10QuietsInstalledWatchFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	v10 := migration10(t)
	createNotes(t, pool, 1)
	require.NoError(t, Outbox{}.InstallWatch(ctx, pool, Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed"}}))
	exec(t, pool, "UPDATE outbox_settings SET notify_interval = '0'")
	conn, err := pgx.Connect(ctx, pool.Config().ConnConfig.ConnString())
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "LISTEN "+ChannelEvents)
	require.NoError(t, err)
	// write updates the watched row and reports whether a notification came.
	write := func() bool {
		t.Helper()
		exec(t, pool, "UPDATE corpus_notes SET title = title || '!' WHERE id = 1")
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := conn.WaitForNotification(wctx)
		return err == nil
	}

	own, generic, _ := watchFunctionsNotify(t, pool, "public")
	require.False(t, own || generic, "version 10's functions notify")
	require.False(t, write())

	_, err = pool.Exec(ctx, v10.down)
	require.NoError(t, err)
	own, generic, _ = watchFunctionsNotify(t, pool, "public")
	require.True(t, own && generic, "the down migration does not put the notification back")
	require.True(t, write(), "the watch function of version 9 notifies")

	_, err = pool.Exec(ctx, v10.up)
	require.NoError(t, err)
	own, generic, _ = watchFunctionsNotify(t, pool, "public")
	require.False(t, own || generic, "the up migration leaves a notification in")
	require.False(t, write())
	require.Len(t, eventsOfType(t, pool, "note.changed"), 3)
}

// migration10 returns migration 010's files.
func migration10(t *testing.T) migrationFile {
	t.Helper()
	files, err := loadMigrations()
	require.NoError(t, err)
	for _, f := range files {
		if f.version == 10 {
			return f
		}
	}
	t.Fatal("no migration 10")
	return migrationFile{}
}

// watchFunctionsNotify reports whether any watch's own trigger function
// (outbox_watch_<16 hex>) in schema calls outbox_notify(), whether the
// generic outbox_watch() there does, and how many own functions there are.
func watchFunctionsNotify(t *testing.T, pool *pgxpool.Pool, schema string) (own, generic bool, ownFunctions int) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT
		coalesce(bool_or(p.prosrc ~ 'outbox_notify\(\)') FILTER (WHERE p.proname ~ '^outbox_watch_[0-9a-f]{16}$'), false),
		coalesce(bool_or(p.prosrc ~ 'outbox_notify\(\)') FILTER (WHERE p.proname = 'outbox_watch'), false),
		count(*) FILTER (WHERE p.proname ~ '^outbox_watch_[0-9a-f]{16}$')
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE p.proname LIKE 'outbox_watch%' AND n.nspname = $1`, schema).Scan(&own, &generic, &ownFunctions))
	return own, generic, ownFunctions
}
