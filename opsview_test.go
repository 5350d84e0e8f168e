package events

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

// opsviewExec runs sql on pool or fails the test.
func opsviewExec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	_, err := pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// insertJob inserts a River job as River leaves it, and returns its ID.
func insertJob(t *testing.T, pool *pgxpool.Pool, table, state string, attempt int, errs ...string) int64 {
	t.Helper()
	var id int64
	errors := "'{}'::jsonb[]"
	if len(errs) > 0 {
		parts := make([]string, len(errs))
		for i, e := range errs {
			parts[i] = fmt.Sprintf("jsonb_build_object('attempt', %d, 'error', %s, 'at', now())", i+1, quoteLiteral(e))
		}
		errors = "ARRAY[" + strings.Join(parts, ", ") + "]"
	}
	finalized := "NULL"
	if state == "completed" || state == "discarded" || state == "cancelled" {
		finalized = "now()"
	}
	require.NoError(t, pool.QueryRow(context.Background(), `INSERT INTO `+table+` (state, attempt, max_attempts, kind, args, errors, attempted_at, finalized_at)
		VALUES ($1, $2::smallint, 25, 'search.reindex', '{}', `+errors+`, CASE WHEN $2::smallint > 0 THEN now() END, `+finalized+`) RETURNING id`,
		state, attempt).Scan(&id))
	return id
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func TestOpsviewListFanoutJobsJoinsRiversJobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, schema := range []string{"", "ops"} {
		t.Run("schema="+schema, func(t *testing.T) {
			t.Parallel()
			var pool *pgxpool.Pool
			jobTable := "river_job"
			if schema == "" {
				pool = testdb.Pool(t, testdb.URL(t))
			} else {
				pool = testdb.Pool(t, testdb.EmptyURL(t))
				require.NoError(t, Outbox{Schema: schema}.Migrate(ctx, pool))
				jobTable = schema + ".river_job"
			}
			o := Outbox{Schema: schema}
			events := schema + map[bool]string{true: ".", false: ""}[schema != ""] + "outbox_events"

			done := insertJob(t, pool, jobTable, "completed", 1)
			failing := insertJob(t, pool, jobTable, "retryable", 2, "index is read-only", "index <b>still</b> read-only")
			gone := done + failing + 1000 // River's retention deleted it
			id := uuid.Must(uuid.NewV7())
			opsviewExec(t, pool, `INSERT INTO `+events+` (id, type, fanned_out_at, fanout) VALUES ($1, 'note.changed', now(), $2)`,
				id, fmt.Sprintf(`{"search": %d, "audit": %d, "mail": %d}`, failing, done, gone))

			jobs, err := o.ListFanoutJobs(ctx, pool, id)
			require.NoError(t, err)
			require.Len(t, jobs, 3)
			for i := range jobs {
				require.False(t, jobs[i].AttemptedAt.IsZero() && jobs[i].Attempt > 0, jobs[i].Subscriber)
				jobs[i].AttemptedAt, jobs[i].FinalizedAt = time.Time{}, time.Time{}
			}
			require.Equal(t, []FanoutJob{
				{Subscriber: "audit", JobID: done, Found: true, State: "completed", Kind: "search.reindex", Attempt: 1, MaxAttempts: 25},
				{Subscriber: "mail", JobID: gone},
				{Subscriber: "search", JobID: failing, Found: true, State: "retryable", Kind: "search.reindex", Attempt: 2, MaxAttempts: 25,
					LastError: "index <b>still</b> read-only"},
			}, jobs, "ordered by subscriber; the last error is the latest attempt's")

			// Not fanned out, or unknown: no jobs.
			pending := uuid.Must(uuid.NewV7())
			opsviewExec(t, pool, `INSERT INTO `+events+` (id, type) VALUES ($1, 'note.changed')`, pending)
			for _, none := range []uuid.UUID{pending, uuid.Must(uuid.NewV7())} {
				jobs, err = o.ListFanoutJobs(ctx, pool, none)
				require.NoError(t, err)
				require.Empty(t, jobs)
			}
		})
	}
}

func TestOpsviewCountFanoutByMinuteCountsEveryMinute(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.URL(t))
	now := time.Now().UTC().Truncate(time.Minute)
	at := func(minutesAgo int, second int) time.Time {
		return now.Add(-time.Duration(minutesAgo)*time.Minute + time.Duration(second)*time.Second)
	}
	// 3 minutes ago: two events, which waited 5 s and 40 s; 1 minute ago: one
	// that waited 2 s; a poisoned one and one older than the range do not
	// count.
	for _, r := range []struct {
		fanned   time.Time
		waited   time.Duration
		poisoned bool
	}{
		{at(3, 10), 5 * time.Second, false}, {at(3, 50), 40 * time.Second, false}, {at(1, 0), 2 * time.Second, false},
		{at(2, 5), time.Second, true}, {at(30, 0), time.Second, false},
	} {
		poisoned := "NULL"
		if r.poisoned {
			poisoned = "now()"
		}
		opsviewExec(t, pool, `INSERT INTO outbox_events (id, type, created_at, fanned_out_at, fanout, poisoned_at)
			VALUES (gen_random_uuid(), 'x', $1, $2, '{}', `+poisoned+`)`, r.fanned.Add(-r.waited), r.fanned)
	}
	got, err := outbox.CountFanoutByMinute(ctx, pool, now.Add(-5*time.Minute+30*time.Second))
	require.NoError(t, err)
	for got[len(got)-1].Minute.After(now) { // the minute turned during the test
		got = got[:len(got)-1]
	}
	for i := range got {
		got[i].Minute = got[i].Minute.UTC()
	}
	require.Equal(t, []MinuteStats{
		{Minute: at(5, 0)}, {Minute: at(4, 0)},
		{Minute: at(3, 0), FannedOut: 2, MaxLag: 40 * time.Second},
		{Minute: at(2, 0)},
		{Minute: at(1, 0), FannedOut: 1, MaxLag: 2 * time.Second},
		{Minute: now},
	}, got, "every minute from since's to now, zeros included")
}

// The per-minute counts read the fanned-out index over the range, not the
// table: EXPLAIN on a table whose rows are mostly older than the range.
func TestOpsviewCountFanoutByMinuteUsesTheFannedIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.URL(t))
	opsviewExec(t, pool, `INSERT INTO outbox_events (id, type, created_at, fanned_out_at, fanout)
		SELECT gen_random_uuid(), 'x', now() - interval '3 days' - g * interval '1 second', now() - interval '2 days' - g * interval '1 second', '{}'
		  FROM generate_series(1, 50000) g`)
	opsviewExec(t, pool, `INSERT INTO outbox_events (id, type, fanned_out_at, fanout) SELECT gen_random_uuid(), 'x', now(), '{}' FROM generate_series(1, 10)`)
	opsviewExec(t, pool, "ANALYZE outbox_events")

	sql, err := statementsFor("")
	require.NoError(t, err)
	query := sql.FanoutByMinute
	var plan strings.Builder
	rows, err := pool.Query(ctx, "EXPLAIN "+query, time.Now().Add(-time.Hour))
	require.NoError(t, err)
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan.WriteString(line + "\n")
	}
	require.NoError(t, rows.Err())
	t.Logf("plan:\n%s", plan.String())
	// The partition that holds the rows (the ring's others are empty).
	var slot int
	require.NoError(t, pool.QueryRow(ctx, "SELECT slot FROM outbox_events LIMIT 1").Scan(&slot))
	require.Contains(t, plan.String(), fmt.Sprintf("outbox_events_%d_fanned_idx", slot), plan.String())
	require.NotContains(t, plan.String(), fmt.Sprintf("Seq Scan on outbox_events_%d ", slot), plan.String())

	got, err := outbox.CountFanoutByMinute(ctx, pool, time.Now().Add(-time.Hour))
	require.NoError(t, err)
	var total int64
	for _, m := range got {
		total += m.FannedOut
	}
	require.Equal(t, int64(10), total)
}

func TestOpsviewCountDeliveriesAndListDeliveriesOfEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.URL(t))
	var o Outbox

	empty, err := o.CountDeliveries(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, empty)

	a, b, c := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	opsviewExec(t, pool, `INSERT INTO outbox_events (id, type, fanned_out_at, fanout) VALUES
		($1, 'note.changed', now(), '{"audit": 1}'), ($2, 'note.changed', now(), '{}'), ($3, 'note.changed', NULL, NULL)`, a, b, c)
	seq := func(id uuid.UUID) int64 {
		var s int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT seq FROM outbox_events WHERE id = $1`, id).Scan(&s))
		return s
	}
	opsviewExec(t, pool, `INSERT INTO outbox_deliveries (event_seq, subscriber, created_at, poisoned_at) VALUES
		($1, 'search', now() - interval '2 hours', NULL),
		($2, 'search', now() - interval '1 hour', NULL),
		($1, 'mail', now(), now()),
		($2, 'mail', now(), now()),
		($2, 'ledger', now(), now())`, seq(a), seq(b))

	got, err := o.CountDeliveries(ctx, pool)
	require.NoError(t, err)
	require.Len(t, got, 3)
	require.Equal(t, int64(2), got["search"].Owed)
	require.Zero(t, got["search"].Poisoned)
	require.WithinDuration(t, time.Now().Add(-2*time.Hour), got["search"].OldestOwedSince, time.Minute)
	require.Equal(t, SubscriberDeliveries{Subscriber: "mail", Poisoned: 2}, got["mail"])
	require.Equal(t, SubscriberDeliveries{Subscriber: "ledger", Poisoned: 1}, got["ledger"])

	// The poisoned deliveries of a page of events, as the web view shows
	// them beside each.
	poisonedOf := func(ids ...uuid.UUID) map[uuid.UUID][]string {
		t.Helper()
		res, err := o.ListDeliveries(ctx, pool, ListDeliveriesParams{State: DeliveryPoisoned, EventIDs: ids})
		require.NoError(t, err)
		require.Empty(t, res.Next)
		names := map[uuid.UUID][]string{}
		for _, d := range res.Deliveries {
			names[d.EventID] = append(names[d.EventID], d.Subscriber)
		}
		return names
	}
	require.Equal(t, map[uuid.UUID][]string{a: {"mail"}, b: {"ledger", "mail"}}, poisonedOf(a, b, c, uuid.Must(uuid.NewV7())))
	require.Equal(t, map[uuid.UUID][]string{b: {"ledger", "mail"}}, poisonedOf(b))
	require.Len(t, poisonedOf(), 2, "no IDs: every event's")
}
