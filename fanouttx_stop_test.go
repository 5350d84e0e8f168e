package events

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// FanOutTx borrows the relay for one call: a Stop racing it has no run to
// stop and must leave it alone, and a Start racing it gets ErrStarted or
// wins. Neither panics nor races (run with -race).
func TestFanOutTxRacingStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	b.record(t, Event{Type: "a"})
	for i := range 200 {
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		fanned := make(chan error, 1)
		go func() {
			_, err := b.relay.FanOutTx(ctx, tx, b.client)
			fanned <- err
		}()
		started := false
		if i%4 == 3 {
			err := b.relay.Start(ctx, b.client)
			if err != nil {
				require.ErrorIs(t, err, ErrStarted, "loop %d", i)
			}
			started = err == nil
		}
		// Stop again and again until FanOutTx returns, so that Stops land
		// all through the call.
		for err = nil; ; {
			require.NoError(t, b.relay.Stop(ctx), "loop %d", i)
			select {
			case err = <-fanned:
			default:
				continue
			}
			break
		}
		if started {
			if err != nil {
				require.ErrorIs(t, err, ErrStarted, "loop %d", i)
			}
		} else {
			require.NoError(t, err, "loop %d", i)
		}
		require.NoError(t, tx.Rollback(ctx))
	}
}
