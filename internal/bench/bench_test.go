package bench

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

func TestMain(m *testing.M) {
	os.Exit(testdb.Main(m, func(context.Context, *pgxpool.Pool) error { return nil }))
}

// The benchmark at tiny sizes, so the program cannot rot: every section runs,
// and no event is lost or fanned out wrongly.
func TestSmoke(t *testing.T) {
	opts := SmokeOptions(testdb.AdminURL(t))
	rep, err := Run(context.Background(), opts)
	require.NoError(t, err)
	require.Zero(t, rep.Lost, "events lost or fanned out wrongly")
	sections := map[string]int{}
	for _, r := range rep.Results {
		sections[r.Section]++
	}
	for _, s := range []string{"throughput", "record", "latency", "receipts", "memory", "backlog", "snapshot"} {
		require.Positive(t, sections[s], "section %s reported nothing", s)
	}
}
