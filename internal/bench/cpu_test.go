package bench

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestStealMeterReadsProcStat(t *testing.T) {
	m := startSteal()
	if !hasProcStat() {
		require.False(t, m.ok, "a steal meter without /proc/stat")
		return
	}
	require.True(t, m.ok, "/proc/stat's cpu line did not parse")
	require.Eventually(t, func() bool { _, ok := m.percent(); return ok }, 30*time.Second, 10*time.Millisecond,
		"no CPU time passed")
	pct, _ := m.percent()
	require.GreaterOrEqual(t, pct, 0.0)
	require.LessOrEqual(t, pct, 100.0)
}

// A span counts the CPU time spent in it, by this process and by the
// machine, which includes this process.
func TestSpanCountsCPU(t *testing.T) {
	s := startSpan()
	busy := time.Now()
	for n := 0; time.Since(busy) < 300*time.Millisecond; n++ {
		_ = n * n
	}
	got := s.end()
	if !hasProcStat() {
		// Without the machine's counters there are no CPU figures, rather
		// than wrong ones.
		require.False(t, got.cpuOK, "a span's CPU time without /proc/stat")
		return
	}
	require.True(t, got.cpuOK, "CPU time could not be read")
	require.GreaterOrEqual(t, got.wall, 300*time.Millisecond)
	// The loop spins on one core the whole time, unless the machine is
	// shared so heavily that it ran for a fraction of it.
	require.Greater(t, got.self, 50*time.Millisecond, "this process's CPU time")
	require.LessOrEqual(t, got.self, got.wall+50*time.Millisecond)
	// The machine's counters tick every 10 ms: allow two ticks.
	require.GreaterOrEqual(t, got.machine, got.self-2*clockTick, "the machine's CPU time includes this process's")
}

// hasProcStat reports whether this machine has /proc/stat (Linux).
func hasProcStat() bool {
	_, err := os.Stat("/proc/stat")
	return err == nil
}
