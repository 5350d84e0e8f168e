package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/claimfloor"
	"github.com/standmeet/events/internal/engine"
	"github.com/standmeet/events/internal/statements"
	"github.com/standmeet/events/internal/testdb"
)

// A look below the floor runs READ COMMITTED whatever the database's
// default: a round that stamps a row while the look walks to it (another
// relay's, holding a row below this relay's floor) made a REPEATABLE READ or
// SERIALIZABLE look fail with a serialization error, and the look from the
// start is due only a minute later. The look is held between its snapshot
// and its read of outbox_events by a table lock while a "round" locks the
// first row, stamps it and commits.
func TestALookBelowTheFloorSurvivesARowStampedWhileItRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, iso := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(iso, func(t *testing.T) {
			url := testdb.URL(t)
			cfg, err := pgxpool.ParseConfig(url)
			require.NoError(t, err)
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = iso
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			sql, err := statements.For("")
			require.NoError(t, err)
			r := engine.New(pool, sql, config(t))
			first := record(t, pool, events.Event{Type: "first"})[0]
			second := record(t, pool, events.Event{Type: "second"})[0]
			x1, x2 := xactID(t, pool, first.ID), xactID(t, pool, second.ID)
			require.Less(t, x1, x2)

			round, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = round.Rollback(ctx) }()
			_, err = round.Exec(ctx, "LOCK TABLE outbox_events IN EXCLUSIVE MODE")
			require.NoError(t, err)
			type result struct {
				found *int64
				err   error
			}
			done := make(chan result, 1)
			go func() {
				found, err := r.LookBelow(ctx, claimfloor.Below{From: x1, Below: x2 + 1})
				done <- result{found, err}
			}()
			require.Eventually(t, func() bool {
				var waiting bool
				require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
					WHERE datname = current_database() AND query LIKE '%outbox_pending_below%' AND wait_event_type = 'Lock')`).Scan(&waiting))
				return waiting
			}, 30*time.Second, 5*time.Millisecond, "the look never waited")

			// A round fans the first row out meanwhile.
			_, err = round.Exec(ctx, "SELECT 1 FROM outbox_events WHERE id = $1 FOR UPDATE", first.ID)
			require.NoError(t, err)
			_, err = round.Exec(ctx, "UPDATE outbox_events SET fanned_out_at = now(), fanout = '{}' WHERE id = $1", first.ID)
			require.NoError(t, err)
			require.NoError(t, round.Commit(ctx))

			var res result
			select {
			case res = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("the look never returned")
			}
			require.NoError(t, res.err, "a look below the floor under default_transaction_isolation = %s failed", iso)
			require.NotNil(t, res.found)
			require.Equal(t, x2, *res.found, "the look did not find the row still pending")
		})
	}
}

// xactID is the transaction that recorded the event id.
func xactID(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) int64 {
	t.Helper()
	var x int64
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT xact_id::text::bigint FROM outbox_events WHERE id = $1", id).Scan(&x))
	return x
}
