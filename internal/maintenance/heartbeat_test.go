package maintenance_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/maintenance"
	"github.com/standmeet/events/internal/testdb"
)

// lockedBuffer is a log sink for several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func heartbeat(t *testing.T, pool *pgxpool.Pool, beat maintenance.Beat) (*maintenance.Heartbeat, *lockedBuffer) {
	t.Helper()
	logs := &lockedBuffer{}
	return &maintenance.Heartbeat{
		DB: pool, SQL: defaultSQL(t), RunID: uuid.Must(uuid.NewV7()), Version: "v9.9.9", ClientID: "client-1",
		OrphanAfter: time.Hour, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		Report: func() maintenance.Beat { return beat },
	}, logs
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	_, err := pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// A beat writes the run's row as the relay reports itself, and stamps the
// subscribers it serves as served.
func TestHeartbeatWritesTheRunsRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	exec(t, pool, "INSERT INTO outbox_subscribers (name, last_served_at) VALUES ('mail', now() - interval '1 day')")
	last, floor := time.Now().Add(-time.Minute).Truncate(time.Microsecond), int64(1234)
	h, _ := heartbeat(t, pool, maintenance.Beat{Subscribers: []string{"mail"}, Listening: true, ConsecutiveFailures: 2,
		LastRound: &last, ClaimFloor: &floor})
	require.NoError(t, h.Beat(ctx))

	var (
		subs                []string
		version, client     string
		listening, pollOnly bool
		failures            int
		lastRound           time.Time
		storedFloor         string
		stopped             *time.Time
		servedAgo           time.Duration
	)
	require.NoError(t, pool.QueryRow(ctx, `SELECT subscribers, version, river_client_id, listening, poll_only,
		consecutive_failures, last_round_at, claim_floor::text, stopped_at FROM outbox_relays WHERE id = $1`, h.RunID).
		Scan(&subs, &version, &client, &listening, &pollOnly, &failures, &lastRound, &storedFloor, &stopped))
	require.Equal(t, []string{"mail"}, subs)
	require.Equal(t, "v9.9.9", version)
	require.Equal(t, "client-1", client)
	require.True(t, listening)
	require.False(t, pollOnly)
	require.Equal(t, 2, failures)
	require.True(t, last.Equal(lastRound), "last round %v, stored %v", last, lastRound)
	require.Equal(t, "1234", storedFloor)
	require.Nil(t, stopped)
	require.NoError(t, pool.QueryRow(ctx, "SELECT now() - last_served_at FROM outbox_subscribers WHERE name = 'mail'").Scan(&servedAgo))
	require.Less(t, servedAgo, time.Hour, "the served subscriber was not stamped")
}

// A beat reads back the subscribers no relay has served for OrphanAfter
// (not its own, nor retired ones), and warns once about each.
func TestHeartbeatReadsAndWarnsOfOrphansOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	exec(t, pool, `INSERT INTO outbox_subscribers (name, last_served_at, retired_at) VALUES
		('lost', now() - interval '2 hours', NULL), ('mine', now() - interval '2 hours', NULL),
		('fresh', now(), NULL), ('retired', now() - interval '2 hours', now())`)
	h, logs := heartbeat(t, pool, maintenance.Beat{Subscribers: []string{"mine"}})
	require.Nil(t, h.Orphaned(), "before any beat")
	for range 3 {
		require.NoError(t, h.Beat(ctx))
		require.Equal(t, []string{"lost"}, h.Orphaned())
	}
	require.Equal(t, 1, strings.Count(logs.String(), "subscriber is orphaned"), "logs: %s", logs)
	require.Contains(t, logs.String(), "subscriber=lost")

	exec(t, pool, "UPDATE outbox_subscribers SET last_served_at = now() WHERE name = 'lost'")
	require.NoError(t, h.Beat(ctx))
	require.Nil(t, h.Orphaned())
}

// The heartbeat lands whatever holds the registry: a subscriber's row that
// an operator's transaction holds is skipped, not waited for (the heartbeat
// is what tells the relays that this process is alive).
func TestHeartbeatDoesNotWaitForAHeldRegistryRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	exec(t, pool, "INSERT INTO outbox_subscribers (name) VALUES ('mail')")
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM outbox_subscribers WHERE name = 'mail' FOR UPDATE")
	require.NoError(t, err)

	h, _ := heartbeat(t, pool, maintenance.Beat{Subscribers: []string{"mail"}})
	beatCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, h.Beat(beatCtx), "the beat waited for the held row")
}

// Run reports in at once and until it is stopped, then marks the run
// stopped, with its claim floor.
func TestHeartbeatRunMarksTheRunStopped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	var floor atomic.Int64
	floor.Store(77)
	h, _ := heartbeat(t, pool, maintenance.Beat{})
	h.Report = func() maintenance.Beat {
		f := floor.Load()
		return maintenance.Beat{ClaimFloor: &f}
	}
	h.OrphanAfter = 30 * time.Millisecond // beats every 10 ms
	stopping, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		h.Run(ctx, stopping)
	}()
	var first, later time.Time
	require.Eventually(t, func() bool {
		err := pool.QueryRow(ctx, "SELECT started_at, last_seen_at FROM outbox_relays WHERE id = $1", h.RunID).Scan(&first, &later)
		return err == nil && later.After(first)
	}, 30*time.Second, 5*time.Millisecond, "the run never reported in twice")
	floor.Store(99) // Report is read again at the stop
	close(stopping)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not end after stopping closed")
	}
	var (
		stopped     *time.Time
		storedFloor string
	)
	require.NoError(t, pool.QueryRow(ctx, "SELECT stopped_at, claim_floor::text FROM outbox_relays WHERE id = $1", h.RunID).
		Scan(&stopped, &storedFloor))
	require.NotNil(t, stopped, "the run was not marked stopped")
	require.Equal(t, "99", storedFloor)
}
