package engine_test

import (
	"context"
	"slices"
	"strings"
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

// A floor claim's rows are locked by outbox_claim_rows, a VOLATILE
// function whose query takes a snapshot of its own (READ COMMITTED), later
// than the snapshot of ClaimFrom's statement. When the statement joined the
// seqs it returned to outbox_events, a transaction (T) that committed
// between the two had its rows locked by the function and dropped by the
// join: the batch came back short although the function filled its LIMIT.
// Observe then took the claim as one that saw every committed row of every
// transaction that had ended at its snapshot, and dropped them from the
// floor, including one (U) that the function's scan never reached: U's
// event was outside the floor, and no claim took it (only a look below
// would). The function returns the rows it locked.
//
// The window between the two snapshots is made wide enough to commit in
// by a pg_sleep ahead of the function's query; the query itself is the
// migration's, unchanged.
func TestAClaimCountsTheRowsItLockedNotThoseAJoinSaw(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if testing.Short() {
		t.Skip("starts a PostgreSQL server of its own")
	}
	pool := testdb.Pool(t, testdb.NewCluster(t).URL)
	sql, err := statements.For("")
	require.NoError(t, err)
	cfg := config(t)
	cfg.BatchSize = 10
	r := engine.New(pool, sql, cfg)
	r.SetClaimFloor(&claimfloor.Floor{Schedule: claimfloor.Schedule{RescanEvery: time.Hour, FullEvery: time.Hour}})

	// One round of the pending lane, as the relay runs it (beginClaim and
	// ended), its stamp reduced to fanned_out_at.
	round := func() []uuid.UUID {
		tx, batch, ended, release, err := r.ClaimPending(ctx, 10)
		require.NoError(t, err)
		defer release()
		var (
			seqs []int64
			ids  []uuid.UUID
		)
		for _, row := range batch {
			seqs = append(seqs, row.Seq)
			ids = append(ids, row.ID)
		}
		_, err = tx.Exec(ctx, "UPDATE outbox_events SET fanned_out_at = now() WHERE seq = ANY($1)", seqs)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		ended(true)
		return ids
	}

	record(t, pool, events.Event{Type: "first"})
	require.Len(t, round(), 1) // the first claim, from the start: the floor is set
	require.Equal(t, claimfloor.From, r.ClaimFloor().Look().Kind)

	// T records more than a batch and stays open; U, younger, commits.
	T, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = T.Rollback(ctx) }()
	many := make([]events.Event, 20)
	for i := range many {
		many[i] = events.Event{Type: "t"}
	}
	_, err = events.RecordMany(ctx, T, many)
	require.NoError(t, err)
	u := record(t, pool, events.Event{Type: "u"})[0]

	// Widen the window between the statement's snapshot and the
	// function's query's.
	var def string
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_get_functiondef(oid) FROM pg_proc
		WHERE proname = 'outbox_claim_rows'`).Scan(&def))
	require.Contains(t, def, "\nBEGIN\n")
	exec(t, pool, strings.Replace(def, "\nBEGIN\n", "\nBEGIN\n    PERFORM pg_sleep(1);\n", 1))

	done := make(chan []uuid.UUID, 1)
	go func() { done <- round() }()
	require.Eventually(t, func() bool { // the round is in the function's sleep
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event = 'PgSleep'`).Scan(&n))
		return n == 1
	}, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, T.Commit(ctx))
	cut := <-done
	t.Logf("the round in the window claimed %d rows; floor after: %+v", len(cut), r.ClaimFloor().Look())
	exec(t, pool, def)

	var claimed []uuid.UUID
	for range 10 {
		ids := round()
		if len(ids) == 0 {
			break
		}
		claimed = append(claimed, ids...)
	}
	t.Logf("then claimed %d rows; floor: %+v", len(claimed), r.ClaimFloor().Look())
	require.True(t, slices.Contains(claimed, u.ID),
		"U's event (committed before the round, its transaction ended at the round's snapshot) is left outside the floor: no claim takes it")
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	_, err := pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}
