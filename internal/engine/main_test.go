package engine_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/testdb"
)

// TestMain runs the engine's tests against a real PostgreSQL, each on a
// database of its own migrated as the library migrates one (River's tables
// and the outbox's). The unit tests of the engine's pure parts
// (package engine) need none. No goroutine of the engine's may outlive them.
func TestMain(m *testing.M) {
	code := testdb.Main(m, func(ctx context.Context, pool *pgxpool.Pool) error {
		return events.Outbox{}.Migrate(ctx, pool)
	})
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}
