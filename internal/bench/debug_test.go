package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

func TestDebugDrain(t *testing.T) {
	if os.Getenv("DEBUG_DRAIN") == "" {
		t.Skip()
	}
	n, _ := strconv.Atoi(os.Getenv("DEBUG_DRAIN"))
	ordered := os.Getenv("DEBUG_ORDERED") != ""
	ctx := context.Background()
	o := SmokeOptions(testdb.AdminURL(t))
	o.Batch = 200
	o.defaults()
	h, err := newHarness(ctx, o.AdminURL)
	require.NoError(t, err)
	defer h.close()
	pool, err := h.database(ctx, 20)
	require.NoError(t, err)
	stop, err := backlogRelays(ctx, pool, o, 1, ordered)
	require.NoError(t, err)
	defer stop()
	require.NoError(t, outbox.PauseSubscriber(ctx, pool, "owed"))
	require.NoError(t, recordOwed(ctx, pool, n))
	require.NoError(t, waitFor(ctx, time.Minute, "x", nothingPending(ctx, pool)))
	start := time.Now()
	require.NoError(t, outbox.ResumeSubscriber(ctx, pool, "owed"))
	for {
		var owed int
		var dead, live int64
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox_deliveries").Scan(&owed))
		require.NoError(t, pool.QueryRow(ctx, "SELECT n_dead_tup, n_live_tup FROM pg_stat_user_tables WHERE relname = 'outbox_deliveries'").Scan(&dead, &live))
		fmt.Println(time.Since(start).Round(time.Millisecond), owed, dead, live)
		if owed == 0 {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
}
