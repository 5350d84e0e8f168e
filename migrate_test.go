package events

import (
	"context"
	"sync"
	"testing"

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
