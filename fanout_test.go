package events

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

// A round of the relay's own whose stamp batch fails, at a stamp statement
// (a BEFORE UPDATE trigger) or at its COMMIT (a deferred constraint
// trigger), in every exec mode used: the round rolls back whole (no job of
// the refused event survives), the pool gets no connection back inside a
// transaction, no backend is left idle in a transaction, and the refused
// event ends charged as a whole while every other event is fanned out.
func TestAFailedStampBatchRollsBackTheWholeRound(t *testing.T) {
	t.Parallel()
	type mode struct {
		mode    pgx.QueryExecMode
		bouncer bool
	}
	modes := map[string]mode{
		"cache statement":           {pgx.QueryExecModeCacheStatement, false},
		"exec":                      {pgx.QueryExecModeExec, false},
		"simple protocol":           {pgx.QueryExecModeSimpleProtocol, false},
		"pgbouncer exec":            {pgx.QueryExecModeExec, true},
		"pgbouncer simple protocol": {pgx.QueryExecModeSimpleProtocol, true},
	}
	triggers := map[string]string{
		"stamp":  "CREATE TRIGGER refuse BEFORE UPDATE ON outbox_events FOR EACH ROW EXECUTE FUNCTION refuse_bad()",
		"commit": "CREATE CONSTRAINT TRIGGER refuse AFTER UPDATE ON outbox_events DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_bad()",
	}
	for mname, mode := range modes {
		for tname, trig := range triggers {
			t.Run(fmt.Sprintf("%s/%s", mname, tname), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				url := testdb.URL(t)
				poolURL := url
				if mode.bouncer {
					poolURL = testdb.PgBouncer(t).URL(url)
				}
				pool := poolInMode(t, poolURL, mode.mode)
				b := setup(t, setupOpts{url: url, pool: pool, config: &RelayConfig{
					RetryBackoff: 5 * time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond, MaxAttempts: 2,
					Listener: ListenerConfig{PollOnly: mode.bouncer, PollInterval: 50 * time.Millisecond},
				}}, mapSub("audit", false, "**"))
				exec(t, b.pool, `CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS $$
					BEGIN
						IF NEW.subject = 'bad' AND NEW.fanned_out_at IS NOT NULL THEN
							RAISE EXCEPTION 'stamp refused' USING ERRCODE = '22023';
						END IF;
						RETURN NEW;
					END $$`)
				exec(t, b.pool, trig)
				es := make([]Event, 10)
				for i := range es {
					es[i] = Event{Type: "a", Subject: fmt.Sprint("ok-", i)}
				}
				es[4].Subject = "bad"
				es = b.record(t, es...)
				b.start(t)
				waitFannedOut(t, b.pool, 20*time.Second)
				require.NoError(t, b.relay.Stop(ctx))

				rows := loadRows(t, b.pool)
				jobs := loadJobs(t, b.pool)
				for i, e := range es {
					r := rows[e.ID]
					if i == 4 {
						require.False(t, r.FannedOut)
						require.True(t, r.Poisoned, "the refused event is charged as a whole and poisoned")
						require.NotNil(t, r.LastError)
						require.Contains(t, *r.LastError, "stamp refused")
						for _, j := range jobs {
							require.NotEqual(t, e.ID, j.EventID, "a job of the refused event survived its round")
						}
						continue
					}
					require.True(t, r.FannedOut, "event %d", i)
					require.Zero(t, r.Attempts, "event %d charged for another's failure", i)
				}
				require.Len(t, jobs, 9)
				require.Zero(t, pool.Stat().AcquiredConns(), "a connection is still out of the pool")
				var inTx int
				require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND state LIKE 'idle in transaction%'`).Scan(&inTx))
				require.Zero(t, inTx, "a backend is left inside a transaction")
			})
		}
	}
}

// FanoutTx, a recovered panic (MarshalJSON inside River): the host's tx
// is still usable, and what the call did to the other events.
func TestPanicFanoutTxLeavesHostTxUsable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{}, panicSub("marshals", false, false), mapSub("audit", false, "**"))
	b.record(t, panicEvent("ok", ""), panicEvent("boom", "marshal"), panicEvent("ok2", ""))
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "CREATE TEMP TABLE host_work (x int)")
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO host_work VALUES (1)")
	require.NoError(t, err)
	_, err = b.relay.FanoutTx(ctx, tx, b.client)
	require.ErrorContains(t, err, "MarshalJSON panicked")
	var x int
	require.NoError(t, tx.QueryRow(ctx, "SELECT x FROM host_work").Scan(&x), "the host's tx is usable")
	require.Equal(t, 1, x)
	var jobs int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM river_job").Scan(&jobs))
	require.Zero(t, jobs, "the failed call's jobs were rolled back")
	require.NoError(t, tx.Commit(ctx))
}

// FanoutTx borrows the relay for one call: a Stop racing it has no run to
// stop and must leave it alone, and a Start racing it gets ErrStarted or
// wins. Neither panics nor races (run with -race).
func TestFanoutTxRacingStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	b.record(t, Event{Type: "a"})
	for i := range 200 {
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		fanned := make(chan error, 1)
		go func() {
			_, err := b.relay.FanoutTx(ctx, tx, b.client)
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
		// Stop again and again until FanoutTx returns, so that Stops land
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
