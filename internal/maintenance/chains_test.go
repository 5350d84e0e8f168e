package maintenance_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/maintenance"
	"github.com/standmeet/events/internal/testdb"
)

// chain makes a chain of sub for subject with n jobs: the head running, the
// rest pending and linked behind it. It returns the jobs' IDs, head first.
func chain(t *testing.T, pool *pgxpool.Pool, sub, subject string, n int) []int64 {
	t.Helper()
	ctx := context.Background()
	var ids []int64
	require.NoError(t, pool.QueryRow(ctx, `WITH j AS (
		INSERT INTO river_job (kind, args, max_attempts, queue, state, tags)
		SELECT 'ordered', '{}', 5, 'default', CASE WHEN i = 1 THEN 'running' ELSE 'pending' END::river_job_state, '{events-ordered}'
		  FROM generate_series(1, $1) i
		RETURNING id)
		SELECT array_agg(id ORDER BY id) FROM j`, n).Scan(&ids))
	exec(t, pool, `INSERT INTO outbox_chains (subscriber, subject, head_job, tail_job, next_pos) VALUES ($1, $2, $3, $4, $5)`,
		sub, subject, ids[0], ids[len(ids)-1], n)
	exec(t, pool, `INSERT INTO outbox_chain_jobs (job_id, subscriber, subject, pos, event_seq, event_id, event_type)
		SELECT id, $1, $2, ord, ord, gen_random_uuid(), 'ordered.changed' FROM unnest($3::bigint[]) WITH ORDINALITY AS u(id, ord)`,
		sub, subject, ids)
	return ids
}

func countRows(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func sweeper(t *testing.T, pool *pgxpool.Pool) *maintenance.ChainSweeper {
	return &maintenance.ChainSweeper{DB: pool, SQL: defaultSQL(t), Tag: "events-ordered", Logger: quiet}
}

// Retiring is final: the chains of a retired subscriber are released (their
// waiting jobs made available, the links and the emptied chains gone), in
// as many statements as it takes; other subscribers' chains are left alone.
func TestChainSweeperReleasesRetiredSubscribersChains(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	exec(t, pool, "INSERT INTO outbox_subscribers (name, retired_at) VALUES ('gone', now()), ('kept', NULL)")
	var gone []int64
	for _, subject := range []string{"a", "b"} {
		gone = append(gone, chain(t, pool, "gone", subject, maintenance.ChainSweepBatch)...) // more links than a statement releases
	}
	kept := chain(t, pool, "kept", "a", 3)

	require.NoError(t, sweeper(t, pool).ReleaseRetired(ctx))

	require.Zero(t, countRows(t, pool, "SELECT count(*) FROM outbox_chain_jobs WHERE subscriber = 'gone'"), "links left")
	require.Zero(t, countRows(t, pool, "SELECT count(*) FROM outbox_chains WHERE subscriber = 'gone'"), "chains left")
	require.Zero(t, countRows(t, pool, "SELECT count(*) FROM river_job WHERE id = ANY($1) AND state = 'pending'", gone),
		"a retired subscriber's job still waits in its chain")
	require.Equal(t, 3, countRows(t, pool, "SELECT count(*) FROM outbox_chain_jobs WHERE subscriber = 'kept'"))
	require.Equal(t, 2, countRows(t, pool, "SELECT count(*) FROM river_job WHERE id = ANY($1) AND state = 'pending'", kept))
}

// The chains of subscribers this release serves unordered are released at
// the run's first sweep (before its rescue, which OnRescued marks).
func TestChainSweeperReleasesUnorderedSubscribersChainsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	exec(t, pool, "INSERT INTO outbox_subscribers (name) VALUES ('plain'), ('ordered')")
	plain := chain(t, pool, "plain", "a", 3)
	ordered := chain(t, pool, "ordered", "a", 3)
	s := sweeper(t, pool)
	s.Unordered, s.Ordered = []string{"plain"}, []string{"ordered"}
	stopping := make(chan struct{})
	s.Stopping = stopping
	firstRescue := make(chan int, 1) // the plain chain's links left at the first sweep's rescue
	s.OnRescued = func() {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox_chain_jobs WHERE subscriber = 'plain'").Scan(&n); err != nil {
			n = -1
		}
		select {
		case firstRescue <- n:
		default:
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx)
	}()
	defer func() {
		close(stopping)
		<-done
	}()
	select {
	case n := <-firstRescue:
		require.Zero(t, n, "the unordered subscriber's chain was not released at the first sweep")
	case <-time.After(30 * time.Second):
		t.Fatal("no sweep ran")
	}
	require.Zero(t, countRows(t, pool, "SELECT count(*) FROM river_job WHERE id = ANY($1) AND state = 'pending'", plain))
	require.Equal(t, 2, countRows(t, pool, "SELECT count(*) FROM river_job WHERE id = ANY($1) AND state = 'pending'", ordered),
		"the ordered subscriber's waiting jobs were released")
}

// Without subscribers there is nothing to sweep: Run returns at once.
func TestChainSweeperWithoutSubscribersReturns(t *testing.T) {
	t.Parallel()
	s := sweeper(t, testdb.New(t))
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(context.Background()) // Stopping nil: would run for ever
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run without subscribers did not return")
	}
}
