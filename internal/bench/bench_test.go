package bench

import (
	"context"
	"os"
	"testing"
	"time"

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

func TestStealMeterReadsProcStat(t *testing.T) {
	if _, err := os.Stat("/proc/stat"); err != nil {
		t.Skip("no /proc/stat here")
	}
	m := startSteal()
	require.True(t, m.ok, "/proc/stat's cpu line did not parse")
	require.Eventually(t, func() bool { _, ok := m.percent(); return ok }, 30*time.Second, 10*time.Millisecond,
		"no CPU time passed")
	pct, _ := m.percent()
	require.GreaterOrEqual(t, pct, 0.0)
	require.LessOrEqual(t, pct, 100.0)
}
