package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/rivershared/baseservice"
	"github.com/riverqueue/river/rivershared/riverpilot"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/claimfloor"
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
	// Registered first: a FanoutTx that registers a new name inserts its
	// registry row in the caller's transaction, and a Start that registers
	// it too waits for that transaction, which this test ends only after
	// Start returns.
	require.NoError(t, b.relay.Start(ctx, b.client))
	require.NoError(t, b.relay.Stop(ctx))
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

// Tests of the pending lane's claim floor (internal/claimfloor, used by
// beginClaim in internal/engine's round.go): the claims start where the pending rows are, and
// no row is ever left behind by it.

// floorURL is a migrated database on a server of the test's own. A relay's
// claim floor follows the server's oldest running transaction, in any
// database: a test that waits for the floor to pass a row, or counts what a
// claim from it reads, runs away from the other tests' open transactions.
func floorURL(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a PostgreSQL server of its own")
	}
	return testdb.NewCluster(t).URL
}

// noRescan is a schedule whose rescans never come within a test: only the
// floor can find a row.
var noRescan = claimfloor.Schedule{RescanEvery: time.Hour, FullEvery: time.Hour}

// holdSnapshot opens a REPEATABLE READ transaction that has read the outbox
// and keeps it open until the test ends: VACUUM may not remove a row version
// that the stamps leave behind meanwhile.
func holdSnapshot(t *testing.T, url string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT count(*) FROM outbox_events")
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
}

// recordOpen records an event of type typ in a transaction it leaves open
// for the test to commit (rolled back at the test's end otherwise).
func recordOpen(t *testing.T, b *testBundle, typ string) (pgx.Tx, Event) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	e, err := Record(ctx, tx, Event{Type: typ})
	require.NoError(t, err)
	return tx, e
}

// requireFannedOutOnce waits for the event id to be fanned out (what says
// what it means if it is not) and requires one job for it.
func requireFannedOutOnce(t *testing.T, b *testBundle, id uuid.UUID, what string) {
	t.Helper()
	require.Eventually(t, func() bool { return fannedOut(t, b.pool, id) }, 30*time.Second, 5*time.Millisecond, what)
	var jobs int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM river_job WHERE args->>'event_id' = $1", id.String()).Scan(&jobs))
	require.Equal(t, 1, jobs)
}

// A transaction that recorded its event before the relays fanned out
// thousands of others, and commits after, with a snapshot held all along:
// its event is above every floor (its transaction was running at every
// claim), and is fanned out once, at once, not at a rescan.
func TestALateCommitIsAboveTheClaimFloor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := floorURL(t)
	b := setup(t, setupOpts{url: url}, mapSub("audit", false, "**"))
	b.relay.eng.Hooks.ClaimFloor = noRescan
	holdSnapshot(t, url)
	b.start(t)
	b.settle(t)

	late, lateEvent := recordOpen(t, b, "late")

	fanOutMeanwhile(t, b)
	require.Positive(t, b.relay.eng.ClaimFloor().Current(), "the relay claims from a floor")

	require.NoError(t, late.Commit(ctx))
	requireFannedOutOnce(t, b, lateEvent.ID, "the late commit was left under the floor")
}

// The same across the partition ring's rotations and retention's TRUNCATEs
// (issue 31's test): a transaction that recorded in one period commits
// several periods later, after the relays fanned out events in the
// partitions between and retention emptied expired ones, with a snapshot
// held all along (over another table: one over outbox_events would keep
// every partition from being emptied). Its event is claimed from the floor,
// once: no look below the floor runs in this test.
func TestALateCommitAcrossRotationsIsAboveTheClaimFloor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := floorURL(t)
	// Rows expire after two and a half periods: a partition is still whole
	// when it leaves the two that hosts write to (retention's DELETEs would
	// otherwise empty it row by row first).
	b := setup(t, setupOpts{url: url, config: &RelayConfig{Retention: 2500 * time.Millisecond, RetentionInterval: 100 * time.Millisecond}},
		mapSub("audit", false, "**"))
	b.relay.eng.Hooks.ClaimFloor = noRescan
	var emptied atomic.Int64
	b.relay.eng.Hooks.Truncated = func(string) { emptied.Add(1) }
	exec(t, b.pool, "SELECT outbox_set_partition_period('1 second')")
	snap, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer snap.Close(ctx)
	held, err := snap.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	require.NoError(t, err)
	defer func() { _ = held.Rollback(ctx) }()
	_, err = held.Exec(ctx, "SELECT count(*) FROM river_job")
	require.NoError(t, err)
	b.start(t)
	b.settle(t)

	late, lateEvent := recordOpen(t, b, "late")
	var lateSlot int
	// Its slot, as the column's default computes it: reading outbox_events
	// here would lock every partition for as long as the transaction runs,
	// and retention could empty none.
	require.NoError(t, late.QueryRow(ctx, "SELECT outbox_slot_of(now())").Scan(&lateSlot))

	// Events in the periods after, fanned out, until retention has emptied
	// a partition and the ring has moved two periods on.
	var ids []uuid.UUID
	require.Eventually(t, func() bool {
		ids = append(ids, b.record(t, Event{Type: "meanwhile"}, Event{Type: "meanwhile"})[0].ID)
		var slot int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT outbox_slot_of(now())").Scan(&slot))
		return emptied.Load() > 0 && (slot-lateSlot+10)%10 >= 2
	}, 60*time.Second, 20*time.Millisecond, "retention emptied no partition, or the ring did not move")
	require.Eventually(t, func() bool { return pendingOf(t, b, ids) == 0 }, 30*time.Second, 10*time.Millisecond)
	require.Positive(t, b.relay.eng.ClaimFloor().Current(), "the relay claims from a floor")

	require.NoError(t, late.Commit(ctx))
	requireFannedOutOnce(t, b, lateEvent.ID, "the late commit was left under the floor")
	t.Logf("%d partitions emptied while the late transaction ran", emptied.Load())
}

// A row that another round held locked while the floor passed it, and that
// the round then let go of (it rolled back), is found by the settled
// rescan: not at the hourly full rescan.
func TestARowLeftBelowTheFloorByARolledBackRoundIsRescanned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := floorURL(t)
	b := setup(t, setupOpts{url: url}, mapSub("audit", false, "**"))
	// Settled long after the few seconds the row is held below.
	b.relay.eng.Hooks.ClaimFloor = claimfloor.Schedule{RescanEvery: 100 * time.Millisecond, SettleAfter: 20 * time.Second, FullEvery: time.Hour}
	b.start(t)
	b.settle(t)
	// Until the floor is that old, a rescan starts at 0 and would find any
	// row.
	require.Eventually(t, func() bool { _, ok := b.relay.eng.ClaimFloor().Settled(time.Now()); return ok }, time.Minute, 50*time.Millisecond)

	// The row is committed, then held by another "round" (FOR UPDATE)
	// while the floor passes it.
	e, _, locker := heldAsTheFloorPassesIt(t, b, "FOR UPDATE")
	require.False(t, fannedOut(t, b.pool, e.ID))

	require.NoError(t, locker.Rollback(ctx))
	require.Eventually(t, func() bool { return fannedOut(t, b.pool, e.ID) }, 30*time.Second, 5*time.Millisecond,
		"a row let go of below the floor waited for the full rescan")
}

// A requeued event is pending again above every floor: its row takes the
// requeuing transaction's ID.
func TestARequeuedEventIsAboveTheClaimFloor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := floorURL(t)
	b := setup(t, setupOpts{url: url}, mapSub("audit", false, "**"))
	b.relay.eng.Hooks.ClaimFloor = noRescan
	e := b.record(t, Event{Type: "poisoned"})[0]
	exec(t, b.pool, "UPDATE outbox_events SET poisoned_at = now(), attempts = 5, last_error = 'test' WHERE id = $1", e.ID)
	b.start(t)
	b.settle(t)
	var xid int64
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT xact_id::text::bigint FROM outbox_events WHERE id = $1", e.ID).Scan(&xid))
	require.Eventually(t, func() bool {
		b.record(t, Event{Type: "later"})
		return b.relay.eng.ClaimFloor().Current() > xid
	}, 30*time.Second, 50*time.Millisecond, "the floor never passed the poisoned row")

	n, err := outbox.Requeue(ctx, b.pool, PoisonedFilter{EventIDs: []uuid.UUID{e.ID}})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Eventually(t, func() bool { return fannedOut(t, b.pool, e.ID) }, 30*time.Second, 5*time.Millisecond,
		"the requeued event stayed below the floor")
}

// Events recorded before the claim floor's migrations, more than a batch of
// them, are all claimed by an idle relay: after the first claim, a floor's
// claims and looks find the rest (every event has carried its transaction's
// ID since migration 002).
func TestEventsRecordedBeforeTheClaimFloorAreClaimedByAnIdleRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.EmptyURL(t)
	pool := testdb.Pool(t, url)
	require.NoError(t, migrate(ctx, pool, Outbox{}, 15))
	for range 5 {
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := Record(ctx, tx, Event{Type: "before.upgrade"})
			return err
		}))
	}
	require.NoError(t, migrate(ctx, pool, Outbox{}, 0))

	b := setup(t, setupOpts{url: url, pool: pool, config: &RelayConfig{BatchSize: 2}}, mapSub("audit", false, "**"))
	// A full rescan every second: each would find the rows, if it looked.
	b.relay.eng.Hooks.ClaimFloor = claimfloor.Schedule{RescanEvery: 100 * time.Millisecond, SettleAfter: time.Second, FullEvery: time.Second}
	b.start(t)
	left := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE fanned_out_at IS NULL").Scan(&n))
		return n
	}
	require.Eventually(t, func() bool { return left() == 0 }, 30*time.Second, 50*time.Millisecond,
		"events recorded before the upgrade stayed pending through ~30 full rescans")
}

// The claim floor lives in the relay's memory for as long as its run, across
// the database going away and coming back — which is how the relay rides out
// a failover (see failover in relay_test.go: the first event after the
// promotion is fanned out within 2 s). But the server it comes back to may
// hand out lower transaction IDs than the floor it learned before: a standby
// promoted behind the primary (asynchronous replication: the IDs of WAL it
// never received are handed out again), a crash that lost asynchronous
// commits, a restore. Every event recorded there is below the floor, which
// Observe never lowers: only the full rescan (every minute, one batch in seq
// order) finds it, until the new server's IDs pass the old floor.
//
// Here the pool fails over from a server whose IDs are far ahead to one whose
// IDs are behind; the relay keeps running with its default schedule.
func TestAnEventRecordedAfterAFailoverToAServerWithLowerTransactionIDsIsFannedOutAtOnce(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts two PostgreSQL servers")
	}
	ctx := context.Background()
	primary, standby := testdb.NewCluster(t), testdb.NewCluster(t)

	// The old primary has handed out many more transaction IDs.
	burn, err := pgx.Connect(ctx, primary.URL)
	require.NoError(t, err)
	_, err = burn.Exec(ctx, "CREATE TABLE burn (i int)")
	require.NoError(t, err)
	_, err = burn.Exec(ctx, `DO $$ BEGIN FOR i IN 1..50000 LOOP
		BEGIN INSERT INTO burn VALUES (i); EXCEPTION WHEN others THEN NULL; END;
	END LOOP; END $$`)
	require.NoError(t, err)
	require.NoError(t, burn.Close(ctx))

	// One address for both, as a failover keeps it (a DNS name, a virtual IP).
	var target atomic.Pointer[testdb.Cluster]
	target.Store(primary)
	cfg, err := pgxpool.ParseConfig(primary.URL)
	require.NoError(t, err)
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		cc.Port = uint16(target.Load().Port())
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	b := setup(t, setupOpts{url: primary.URL, pool: pool}, mapSub("audit", false, "**"))
	b.start(t)
	b.settle(t)
	before := b.record(t, Event{Type: "before"})[0]
	require.Eventually(t, func() bool { return fannedOut(t, pool, before.ID) }, 30*time.Second, 5*time.Millisecond)
	floor := b.relay.eng.ClaimFloor().Current()
	require.Positive(t, floor)
	// The floor has settled (until then a rescan starts at 0 and would find
	// any row): a relay that has run for more than a few seconds.
	require.Eventually(t, func() bool { _, ok := b.relay.eng.ClaimFloor().Settled(time.Now()); return ok }, time.Minute, 50*time.Millisecond)

	// Failover: the old primary goes away, the address leads to the new one.
	target.Store(standby)
	primary.Crash()
	pool.Reset()
	var standbyXid int64
	require.Eventually(t, func() bool {
		return pool.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&standbyXid) == nil
	}, 30*time.Second, 10*time.Millisecond)
	t.Logf("relay's floor %d; the new primary hands out %d", floor, standbyXid)
	require.Less(t, standbyXid, floor, "the test needs the new primary behind the floor")

	after := b.record(t, Event{Type: "after.failover"})[0]
	recorded := time.Now()
	require.Eventually(t, func() bool { return fannedOut(t, pool, after.ID) }, 10*time.Second, 5*time.Millisecond,
		"an event recorded after the failover stayed pending below the old server's claim floor")
	t.Logf("fanned out %v after its commit", time.Since(recorded))
}

// heldAsTheFloorPassesIt records an event (waking no relay) that another
// transaction then holds locked (lock: FOR UPDATE, as a round holds it, or a
// host's FOR KEY SHARE), and records later events until b's running relay
// has moved its floor above the event's transaction. It returns the event,
// its transaction's ID and the holding transaction (rolled back when t ends).
func heldAsTheFloorPassesIt(t *testing.T, b *testBundle, lock string) (Event, int64, pgx.Tx) {
	t.Helper()
	ctx := context.Background()
	var (
		e      Event
		holder pgx.Tx
	)
	// The relay's polls may claim the row between its commit and the
	// holder's lock (on a busy machine they did): then the holder finds it
	// fanned out, and the test takes a new row.
	for try := 1; ; try++ {
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			e, err = Outbox{NotifyInterval: NotifyNever}.Record(ctx, tx, Event{Type: "held"})
			return err
		}))
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		tag, err := tx.Exec(ctx, "SELECT 1 FROM outbox_events WHERE id = $1 AND fanned_out_at IS NULL "+lock, e.ID)
		require.NoError(t, err)
		if tag.RowsAffected() == 1 {
			holder = tx
			t.Cleanup(func() { _ = holder.Rollback(ctx) })
			break
		}
		require.NoError(t, tx.Rollback(ctx))
		require.Less(t, try, 10, "the relay fanned out every row before it could be held")
	}
	xid := maxXactID(t, b, []uuid.UUID{e.ID})
	require.Eventually(t, func() bool {
		b.record(t, Event{Type: "later"})
		return b.relay.eng.ClaimFloor().Current() > xid
	}, 30*time.Second, 50*time.Millisecond, "the floor never passed the held row")
	return e, xid, holder
}

// deadEntriesUnderAHeldSnapshot holds a snapshot on url's database for the
// rest of the test, has b's relay fan out 2,000 events meanwhile (their
// stamps leave as many dead entries in the pending indexes), stops it, and
// analyzes the table.
func deadEntriesUnderAHeldSnapshot(t *testing.T, b *testBundle, url string) {
	t.Helper()
	ctx := context.Background()
	holdSnapshot(t, url)
	b.start(t)
	b.settle(t)
	fanOutMeanwhile(t, b)
	require.NoError(t, b.relay.Stop(ctx))
	exec(t, b.pool, "ANALYZE outbox_events")
}

// statsConn is a connection (or pool) whose statistics a test reads.
type statsConn interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}

// pendingEntriesRead is how many entries of the pending and claim floor
// indexes the server has read so far.
func pendingEntriesRead(t *testing.T, db statsConn) int64 {
	t.Helper()
	return indexEntriesRead(t, db, `^outbox_events_(\d+_)?(pending|claim_floor)_idx$`) // every partition's
}

// indexEntriesRead is how many entries of the indexes whose names match
// pattern the server has read so far, db's own included.
func indexEntriesRead(t *testing.T, db statsConn, pattern string) int64 {
	t.Helper()
	ctx := context.Background()
	_, err := db.Exec(ctx, "SELECT pg_stat_force_next_flush()") // this backend's counts so far
	require.NoError(t, err)
	var n int64
	require.NoError(t, db.QueryRow(ctx, `SELECT coalesce(sum(idx_tup_read), 0)::bigint FROM pg_stat_user_indexes
		WHERE indexrelname ~ $1`, pattern).Scan(&n))
	return n
}

// Under a held snapshot, a claim from the floor reads the floor index from
// the floor on: not the dead entries that the stamps of thousands of earlier
// events left in the pending index, which the planner, counting few pending
// rows, would as soon walk and sort (outbox_claim_from prices the sort out).
func TestAClaimFromTheFloorStepsOverNoDeadEntries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := floorURL(t)
	b := setup(t, setupOpts{url: url}, mapSub("audit", false, "**"))
	b.relay.eng.Hooks.ClaimFloor = noRescan
	deadEntriesUnderAHeldSnapshot(t, b, url)

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var fresh []uuid.UUID
	for range 10 {
		fresh = append(fresh, b.record(t, Event{Type: "fresh"})[0].ID)
	}
	var floor int64
	require.NoError(t, conn.QueryRow(ctx, "SELECT min(xact_id::text::bigint) FROM outbox_events WHERE id = ANY($1)", fresh).Scan(&floor))
	before, scannedBefore := pendingEntriesRead(t, conn), rowsScanned(t, conn)
	for range 10 { // a generic plan is made after the fifth
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		rows, err := tx.Query(ctx, b.relay.sql.ClaimFrom, int64(200), floor, int64(0), []int64(nil))
		require.NoError(t, err)
		claimed, err := pgx.CollectRows(rows, func(pgx.CollectableRow) (int, error) { return 1, nil })
		require.NoError(t, err)
		require.Len(t, claimed, 10)
		require.NoError(t, tx.Rollback(ctx))
	}
	// The stamps of 2,000 events left at least as many dead entries in each
	// index: ten claims that walked them would read 20,000.
	got, scanned := pendingEntriesRead(t, conn)-before, rowsScanned(t, conn)-scannedBefore
	t.Logf("index entries read by ten claims from the floor: %d; rows read by sequential scans: %d", got, scanned)
	require.Less(t, got, int64(2_000), "claims from the floor walk the dead entries")
	// The claim joins the rows its function returns to the table: by
	// primary key, not by hashing the whole table (the plan the planner
	// chose at the function's default estimate of 1,000 rows).
	require.Zero(t, scanned, "claims read the whole table")

	// So do an idle relay's polls: the next retry through the retry index,
	// not the pending index filtered.
	before = pendingEntriesRead(t, conn)
	for range 10 {
		var waiting bool
		var secs *float64
		var xmin int64
		var started time.Time
		require.NoError(t, conn.QueryRow(ctx, b.relay.sql.Poll, []string{"audit"}, floor, int64(0), []int64(nil), []time.Time{{}}, []int64{0}).Scan(&waiting, &secs, &xmin, &started))
		require.True(t, waiting)
	}
	got = pendingEntriesRead(t, conn) - before
	t.Logf("index entries read by ten polls from the floor: %d", got)
	require.Less(t, got, int64(2_000), "polls walk the dead entries")

	// And the claims of failed events whose retry is due, which a busy
	// relay runs several times a second: through the retry index.
	before = pendingEntriesRead(t, conn)
	for range 10 {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		rows, err := tx.Query(ctx, b.relay.sql.ClaimDue, int64(1))
		require.NoError(t, err)
		rows.Close()
		require.NoError(t, rows.Err())
		require.NoError(t, tx.Rollback(ctx))
	}
	got = pendingEntriesRead(t, conn) - before
	t.Logf("index entries read by ten claims of due retries: %d", got)
	require.Less(t, got, int64(2_000), "claims of due retries walk the dead entries")
}

// A transaction that wrote and stays open (a console's BEGIN after an
// UPDATE, a long batch job) is the oldest running one for as long as it
// runs, and keeps VACUUM from removing the dead entries the stamps leave
// behind, as a held snapshot does. A floor at the oldest running
// transaction stayed at it, and every claim walked the dead entries of every
// event fanned out since. The floor keeps it as itself: the claims probe it,
// then start from the snapshot's xmax; and its event, committed at last, is
// fanned out once, at once, not at a look below.
func TestAWriterLeftOpenDoesNotPinTheClaimFloor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := floorURL(t)
	b := setup(t, setupOpts{url: url}, mapSub("audit", false, "**"))
	b.relay.eng.Hooks.ClaimFloor = noRescan
	holdSnapshot(t, url) // the dead entries stay, whatever autovacuum does
	open, openEvent := recordOpen(t, b, "open")
	var openXid int64
	require.NoError(t, open.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&openXid))

	b.start(t)
	b.settle(t)
	fanOutMeanwhile(t, b)
	require.Contains(t, b.relay.eng.ClaimFloor().Look().Running, openXid, "the floor keeps the open writer")

	floor := b.relay.eng.ClaimFloor().Look()
	require.Contains(t, floor.Running, openXid, "the floor keeps the open writer")
	require.Greater(t, floor.From, openXid)
	require.NoError(t, b.relay.Stop(ctx))
	exec(t, b.pool, "ANALYZE outbox_events")

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var fresh []uuid.UUID
	for range 10 {
		fresh = append(fresh, b.record(t, Event{Type: "fresh"})[0].ID)
	}
	claim := func(c claimfloor.Claim) (ids []uuid.UUID, read int64) {
		t.Helper()
		before := pendingEntriesRead(t, conn)
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		rows, err := tx.Query(ctx, b.relay.sql.ClaimFrom, int64(200), c.From, c.FromSeq, c.Running)
		require.NoError(t, err)
		ids, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (uuid.UUID, error) {
			var id uuid.UUID
			err := row.Scan(nil, &id, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil)
			return id, err
		})
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
		return ids, pendingEntriesRead(t, conn) - before
	}
	// The stamps of 2,000 events left at least as many dead entries in the
	// floor index above the open writer's transaction: a claim from it
	// reads them all.
	ids, read := claim(claimfloor.Claim{Kind: claimfloor.From, From: openXid})
	require.ElementsMatch(t, fresh, ids)
	require.GreaterOrEqual(t, read, int64(2_000), "no dead entries to step over: the test proves nothing")
	ids, read = claim(floor)
	t.Logf("index entries read by a claim from the floor: %d", read)
	require.ElementsMatch(t, fresh, ids)
	require.Less(t, read, int64(100), "the claims walk the dead entries from the open writer's transaction")
	// So do an idle relay's polls.
	before := pendingEntriesRead(t, conn)
	var (
		waiting bool
		secs    *float64
		xmin    int64
		started time.Time
	)
	require.NoError(t, conn.QueryRow(ctx, b.relay.sql.Poll, []string{"audit"}, floor.From, floor.FromSeq, floor.Running, []time.Time{{}}, []int64{0}).Scan(&waiting, &secs, &xmin, &started))
	require.True(t, waiting)
	require.Less(t, pendingEntriesRead(t, conn)-before, int64(100), "the polls walk the dead entries from the open writer's transaction")

	// The writer commits at last: its event is the floor's first.
	require.NoError(t, open.Commit(ctx))
	// The looks below the floor leave it to the claims: lowering the floor
	// to it would make them walk down to it again.
	var found *int64
	require.NoError(t, conn.QueryRow(ctx, b.relay.sql.PendingBelow, int64(0), floor.From, floor.FromSeq, []int64(nil), floor.Running).Scan(&found))
	require.Nil(t, found, "a look below the floor found a row the claims read")
	require.NoError(t, conn.QueryRow(ctx, b.relay.sql.PendingBelow, int64(0), floor.From, floor.FromSeq, []int64(nil), []int64(nil)).Scan(&found))
	require.Equal(t, &openXid, found)
	ids, _ = claim(floor)
	require.ElementsMatch(t, append([]uuid.UUID{openEvent.ID}, fresh...), ids)
}

// A backlog that one transaction recorded is claimed batch after batch,
// each from where the last ended: from the transaction's first row, each
// claim would step over the entries of every row stamped before it, which
// a held snapshot keeps from being marked dead (2,000 events in batches of
// 100: 21,000 entries read, not 2,000).
func TestClaimsOfOneTransactionsBacklogStartWhereTheLastEnded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := floorURL(t)
	b := setup(t, setupOpts{url: url, config: &RelayConfig{BatchSize: 100}}, mapSub("audit", false, "**"))
	b.relay.eng.Hooks.ClaimFloor = noRescan
	var (
		mu     sync.Mutex
		claims []claimfloor.Claim
	)
	b.relay.eng.Hooks.FloorClaim = func(c claimfloor.Claim) {
		mu.Lock()
		defer mu.Unlock()
		claims = append(claims, c)
	}
	holdSnapshot(t, url)
	b.start(t)
	b.settle(t)
	backlog := func() (xid int64) {
		t.Helper()
		batch := make([]Event, 2_000)
		for i := range batch {
			batch[i] = Event{Type: "backlog"}
		}
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := RecordMany(ctx, tx, batch); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&xid)
		}))
		return xid
	}
	xid := backlog()
	require.Eventually(t, func() bool { return pendingCount(t, b.pool) == 0 }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, b.relay.Stop(ctx))
	mu.Lock()
	var after []int64 // where the relay's claims of the backlog started in it
	for _, c := range claims {
		if c.Kind == claimfloor.From && c.From == xid {
			after = append(after, c.FromSeq)
		}
	}
	mu.Unlock()
	t.Logf("claims from within the backlog's transaction, after seq: %v", after)
	resumed := slices.DeleteFunc(slices.Clone(after), func(seq int64) bool { return seq == 0 })
	require.GreaterOrEqual(t, len(resumed), 15, "2,000 rows in batches of 100: the claims start where the last ended")
	slices.Sort(resumed)
	require.GreaterOrEqual(t, len(slices.Compact(resumed)), 10, "the claims start where the last ended")

	// What that saves, counted on a connection of the test's own: claims
	// in batches of 100 that each stamp what they took, from where the
	// last ended or from the transaction's first row.
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	drain := func(xid int64, resume bool) (read int64) {
		t.Helper()
		before := pendingEntriesRead(t, conn)
		var seq int64
		for {
			var seqs []int64
			require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				rows, err := tx.Query(ctx, b.relay.sql.ClaimFrom, int64(100), xid, seq, []int64(nil))
				if err != nil {
					return err
				}
				seqs, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (int64, error) {
					var s int64
					err := row.Scan(&s, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil)
					return s, err
				})
				if err != nil || len(seqs) == 0 {
					return err
				}
				_, err = tx.Exec(ctx, "UPDATE outbox_events SET fanned_out_at = now() WHERE seq = ANY($1)", seqs)
				return err
			}))
			if len(seqs) == 0 {
				return pendingEntriesRead(t, conn) - before
			}
			if resume {
				seq = slices.Max(seqs)
			}
		}
	}
	fromFirst, fromLast := drain(backlog(), false), drain(backlog(), true)
	t.Logf("index entries read draining 2,000 rows of one transaction: %d from its first row each time, %d resuming", fromFirst, fromLast)
	require.Greater(t, fromFirst, int64(10_000), "no dead entries to step over: the test proves nothing")
	require.Less(t, fromLast, int64(5_000))
}

// fanOutMeanwhile records 2,000 events, in 20 transactions, and waits until
// the running relay has fanned every event out: their stamps leave at least
// as many dead entries in the pending indexes.
func fanOutMeanwhile(t *testing.T, b *testBundle) {
	t.Helper()
	batch := make([]Event, 100)
	for i := range batch {
		batch[i] = Event{Type: "meanwhile"}
	}
	for range 20 {
		b.record(t, batch...)
	}
	require.Eventually(t, func() bool { return pendingCount(t, b.pool) == 0 }, 30*time.Second, 10*time.Millisecond,
		"the 2,000 events were not fanned out")
}

// pendingCount counts the events not yet fanned out.
func pendingCount(t *testing.T, db statsConn) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(), "SELECT count(*) FROM outbox_events WHERE fanned_out_at IS NULL").Scan(&n))
	return n
}

// rowsScanned is how many rows of outbox_events (its partitions)
// sequential scans have read so far.
func rowsScanned(t *testing.T, db statsConn) int64 {
	t.Helper()
	ctx := context.Background()
	_, err := db.Exec(ctx, "SELECT pg_stat_force_next_flush()") // this backend's counts so far
	require.NoError(t, err)
	var n int64
	require.NoError(t, db.QueryRow(ctx, `SELECT coalesce(sum(seq_tup_read), 0)::bigint FROM pg_stat_user_tables WHERE relname ~ '^outbox_events_(\d+|legacy)$'`).Scan(&n))
	return n
}

// pendingOf counts the rows of ids still pending.
func pendingOf(t *testing.T, b *testBundle, ids []uuid.UUID) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT count(*) FROM outbox_events WHERE id = ANY($1) AND fanned_out_at IS NULL", ids).Scan(&n))
	return n
}

// maxXactID is the largest xact_id among ids.
func maxXactID(t *testing.T, b *testBundle, ids []uuid.UUID) int64 {
	t.Helper()
	var x int64
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT max(xact_id::text::bigint) FROM outbox_events WHERE id = ANY($1)", ids).Scan(&x))
	return x
}

// Rows left below the floor for longer than SettleAfter (rounds that held
// them that long and rolled back, an old release's Requeue) are found by the
// look from the start, and all of them are claimed at once, however many
// batches they fill: the look lowers the floor to the first, and the claims
// from there rise with them (a full rescan claiming one batch a minute left
// 2,000 rows waiting ten minutes).
//
// Here ten rows are held by another "round" (FOR UPDATE, as a round holds
// them) while the relay's floor passes them and settles, then let go of.
// BatchSize 2, FullEvery 5 s: all are fanned out within a look's period
// (plus a poll), not one batch per look (five looks, 25 s); the bound
// allows two and a half looks, for a busy machine.
func TestRowsLeftBelowTheFloorAreClaimedAllAtOnceWhenALookFindsThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := floorURL(t)
	b := setup(t, setupOpts{url: url, config: &RelayConfig{BatchSize: 2}}, mapSub("audit", false, "**"))
	const fullEvery = 5 * time.Second
	b.relay.eng.Hooks.ClaimFloor = claimfloor.Schedule{RescanEvery: 100 * time.Millisecond, SettleAfter: 500 * time.Millisecond, FullEvery: fullEvery}

	held := Outbox{NotifyInterval: NotifyNever}
	var ids []uuid.UUID
	for range 10 {
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			e, err := held.Record(ctx, tx, Event{Type: "held"})
			ids = append(ids, e.ID)
			return err
		}))
	}
	locker, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = locker.Rollback(ctx) }()
	_, err = locker.Exec(ctx, "SELECT 1 FROM outbox_events WHERE id = ANY($1) FOR UPDATE", ids)
	require.NoError(t, err)
	maxXid := maxXactID(t, b, ids)

	b.start(t)
	b.settle(t)
	// The floor has passed the held rows and has done so for longer than
	// SettleAfter: the settled rescan starts above them too.
	require.Eventually(t, func() bool {
		s, ok := b.relay.eng.ClaimFloor().Settled(time.Now())
		return ok && s > maxXid
	}, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, 10, pendingOf(t, b, ids))

	require.NoError(t, locker.Rollback(ctx)) // the round that held them rolls back
	released := time.Now()
	require.Eventually(t, func() bool { return pendingOf(t, b, ids) == 0 }, 60*time.Second, 20*time.Millisecond)
	took := time.Since(released)
	t.Logf("10 rows stranded below the floor (BatchSize 2, FullEvery %v) fanned out %v after release", fullEvery, took)
	require.Less(t, took, fullEvery*5/2,
		"rows below the floor beyond one batch waited one full rescan per batch")
}

// fannedOutBelowASettledFloor records three events, waits for the relay to
// fan them out and for its settled floor (the relay has run a few seconds
// since) to pass their transactions, and returns their IDs.
func fannedOutBelowASettledFloor(t *testing.T, b *testBundle) []uuid.UUID {
	t.Helper()
	es := b.record(t, Event{Type: "a"}, Event{Type: "b"}, Event{Type: "c"})
	ids := []uuid.UUID{es[0].ID, es[1].ID, es[2].ID}
	require.Eventually(t, func() bool { return pendingOf(t, b, ids) == 0 }, 30*time.Second, 5*time.Millisecond)
	maxXid := maxXactID(t, b, ids)
	require.Eventually(t, func() bool {
		s, ok := b.relay.eng.ClaimFloor().Settled(time.Now())
		return ok && s > maxXid
	}, 30*time.Second, 50*time.Millisecond)
	return ids
}

// lostRoundCommit undoes what the round that fanned out ids wrote, as a
// crash that lost its (asynchronous) commit leaves it: the stamps and the
// jobs gone, the rows pending with their old transaction IDs.
func lostRoundCommit(t *testing.T, b *testBundle, ids []uuid.UUID) {
	t.Helper()
	exec(t, b.pool, "UPDATE outbox_events SET fanned_out_at = NULL, fanout = NULL WHERE id = ANY($1)", ids)
	names := make([]string, len(ids))
	for i, id := range ids {
		names[i] = id.String()
	}
	exec(t, b.pool, "DELETE FROM river_job WHERE args->>'event_id' = ANY($1)", names)
}

// A round commits with synchronous_commit off, and its commit moves the
// floor; a server crash may lose that commit, leaving its rows pending again
// with their old transaction IDs, below the floor. Transaction IDs need not
// go back below the floor (the host transactions that recorded the rows
// committed synchronously), so neither the poll's check nor a claim's sees
// it: the crash's dropped connections do. A relay that reconnects looks
// below its floor at once, and claims them.
//
// The crash is reproduced as what recovery leaves: the round's stamp and
// jobs undone, the rows as they were, transaction IDs going on, every
// connection dropped. Default schedule: the look from the start would come
// only after a minute.
func TestRowsOfARoundACrashLostAreClaimedOnceTheRelayReconnects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := floorURL(t)
	b := setup(t, setupOpts{url: url}, mapSub("audit", false, "**"))
	b.start(t)
	b.settle(t)
	ids := fannedOutBelowASettledFloor(t, b)
	lostRoundCommit(t, b, ids)
	var xmin int64
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint").Scan(&xmin))
	require.GreaterOrEqual(t, xmin, b.relay.eng.ClaimFloor().Current(), "transaction IDs did not go back below the floor")

	// The crash drops every connection.
	exec(t, b.pool, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
	b.pool.Reset()

	lost := time.Now()
	require.Eventually(t, func() bool { return pendingOf(t, b, ids) == 0 }, 30*time.Second, 20*time.Millisecond,
		"rows of a round a crash lost stayed pending below the floor")
	took := time.Since(lost)
	t.Logf("claimed %v after the crash", took)
	require.Less(t, took, 20*time.Second, "found only by the look from the start, a minute on")
}

// A relay that starts claims from the relays' last claim floor, written with
// their heartbeats and when they stop: a deploy's new process, under a held
// snapshot, does not first walk the dead entries of every event fanned out
// since, from the start, to reach a backlog recorded while none ran.
func TestARelayStartsFromTheRelaysLastClaimFloor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := floorURL(t)
	b := setup(t, setupOpts{url: url}, mapSub("audit", false, "**"))
	b.relay.eng.Hooks.ClaimFloor = noRescan
	deadEntriesUnderAHeldSnapshot(t, b, url)
	last := b.relay.eng.ClaimFloor().Current()
	require.Positive(t, last)
	var stored int64
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT max(claim_floor::text::bigint) FROM outbox_relays").Scan(&stored))
	require.Equal(t, last, stored, "the stopped relay wrote its floor")

	// A backlog recorded while no relay runs, then a new run.
	var backlog []uuid.UUID
	batch := make([]Event, 100)
	for i := range batch {
		batch[i] = Event{Type: "backlog"}
	}
	for range 5 {
		for _, e := range b.record(t, batch...) {
			backlog = append(backlog, e.ID)
		}
	}
	var (
		mu     sync.Mutex
		claims []claimfloor.Claim
	)
	b.relay.eng.Hooks.FloorClaim = func(c claimfloor.Claim) {
		mu.Lock()
		defer mu.Unlock()
		claims = append(claims, c)
	}
	b.start(t)
	// (By ID: a count of the pending rows would walk the dead entries.)
	require.Eventually(t, func() bool { return pendingOf(t, b, backlog) == 0 }, 30*time.Second, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, claims)
	t.Logf("the new run's first claims: %v (stored floor %d)", claims[:min(len(claims), 4)], stored)
	require.Equal(t, claimfloor.Claim{Kind: claimfloor.From, From: stored}, claims[0],
		"the new run's first claim started from the start, over every dead entry, not at the stored floor")
}

// The looks skip what the claims skip (FOR UPDATE SKIP LOCKED, both): a row
// a host holds locked, FOR KEY SHARE here (a host's foreign key to
// outbox_events takes it with every insert of a referencing row), is not
// found below the floor by every look. Found, it lowered the floor, the
// claim from there skipped it again and raised the floor, and the next look
// lowered it again, every RescanEvery for as long as the host held it, each
// claim walking the dead entries the floor is there to step over.
func TestARowTheClaimsCannotTakeDoesNotKeepPullingTheFloorDown(t *testing.T) {
	t.Parallel()
	url := floorURL(t)
	b := setup(t, setupOpts{url: url}, mapSub("audit", false, "**"))
	b.relay.eng.Hooks.ClaimFloor = claimfloor.Schedule{RescanEvery: 50 * time.Millisecond, SettleAfter: 200 * time.Millisecond, FullEvery: time.Hour}
	b.start(t)
	b.quiesce(t)

	_, heldXid, _ := heldAsTheFloorPassesIt(t, b, "FOR KEY SHARE")

	// For three seconds: how often is the floor pulled back down to the row?
	lowered, at := 0, false
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Microsecond) {
		now := b.relay.eng.ClaimFloor().Current() <= heldXid
		if now && !at {
			lowered++
		}
		at = now
	}
	t.Logf("the floor was lowered to the held row %d times in 3 s", lowered)
	require.LessOrEqual(t, lowered, 1, "a row the claims cannot take keeps pulling the floor down")
}

// A relay without a listener (PollOnly, the mode behind PgBouncer) learns of
// a server restart from its poll (the server's start time), since the pool
// replaces dead connections quietly and no round need fail: it looks below
// its floor at once, for the rows of a round whose commit the crash lost.
// The lost commit is reproduced as what recovery leaves (stamps and jobs
// undone), then the server restarts.
func TestRowsOfARoundACrashLostAreClaimedOnceAPollOnlyRelayIsBack(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("restarts a PostgreSQL server of its own")
	}
	ctx := context.Background()
	cluster := testdb.NewCluster(t)
	b := setup(t, setupOpts{url: cluster.URL, config: &RelayConfig{Listener: ListenerConfig{PollOnly: true}}}, mapSub("audit", false, "**"))
	b.start(t)
	b.settle(t)
	ids := fannedOutBelowASettledFloor(t, b)
	lostRoundCommit(t, b, ids)
	cluster.Stop()
	require.NoError(t, cluster.Start(ctx))
	// The pool's connections are new before the relay uses one (pgxpool
	// pings a connection idle for a second): no poll or round fails.
	b.pool.Reset()

	lost := time.Now()
	require.Eventually(t, func() bool {
		var n int
		err := b.pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE id = ANY($1) AND fanned_out_at IS NULL", ids).Scan(&n)
		return err == nil && n == 0
	}, 90*time.Second, 20*time.Millisecond, "rows of a round a crash lost stayed pending below the floor")
	took := time.Since(lost)
	t.Logf("claimed %v after the restart", took)
	require.Less(t, took, 20*time.Second, "a PollOnly relay found them only by the look from the start, a minute on")
}

// Stop cancels a look below the floor in flight: a look runs with no
// statement_timeout (under a held snapshot a look from the start walks
// every dead entry), so one that waits — here for a table lock, as it
// would for a long scan — must not hold Stop for as long as it lasts. No
// event is recorded and the relay has no subscriber: its first claim,
// short, gives it its floor, nothing wakes it to claim again, and it has
// no deliveries lane to serve when idle (a round would wait for the lock
// too, and a round in flight is Stop's to wait for).
func TestStopCancelsALookBelowTheFloorInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{config: &RelayConfig{Retention: -1}})
	b.relay.eng.Hooks.ClaimFloor = claimfloor.Schedule{RescanEvery: 10 * time.Millisecond, SettleAfter: 10 * time.Millisecond, FullEvery: 20 * time.Millisecond}
	b.start(t)
	select { // listening, and its claim after it connected is over
	case <-b.relay.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("the relay never got ready")
	}
	require.Eventually(t, func() bool { return b.relay.eng.ClaimFloor().Current() > 0 },
		30*time.Second, 5*time.Millisecond, "the relay never claimed from a floor")

	lock, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(ctx) }()
	_, err = lock.Exec(ctx, "LOCK TABLE outbox_events IN EXCLUSIVE MODE") // plain reads (the poll) go on
	require.NoError(t, err)
	waiting := func(like string) bool {
		var w bool
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE $1 AND wait_event_type = 'Lock' AND pid <> pg_backend_pid())`, like).Scan(&w))
		return w
	}
	require.Eventually(t, func() bool { return waiting("%outbox_pending_below%") }, 30*time.Second, 5*time.Millisecond,
		"no look waited for the lock")
	rows, err := b.pool.Query(ctx, `SELECT query FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND datname = current_database() AND query NOT LIKE '%outbox_pending_below%'`)
	require.NoError(t, err)
	others, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, others, "more than the look waits for the lock: the test cannot tell what holds Stop: %q", others)

	stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	began := time.Now()
	require.NoError(t, b.relay.Stop(stopCtx), "Stop waited for the look (%v)", time.Since(began))
	require.Eventually(t, func() bool { return !waiting("%outbox_pending_below%") }, 30*time.Second, 10*time.Millisecond,
		"the look still waits on the server after Stop")
}

// The functions that every round (its claim and stamp, or the idle poll, a
// look below the floor, an ordered append, Stats) calls keep their plans
// for the session, generic as an SQL function's were: planned at every
// call, each cost 1-3 ms over the ten partitions of outbox_events, and
// commit→fanned latency doubled (migration 021; eventsbench -only latency
// measures it).
func TestTheRoundsFunctionsKeepTheirPlans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.URL(t))
	for _, fn := range []string{
		"outbox_claim_rows(xid8, bigint, xid8[], integer)", "outbox_claim_due(integer)",
		"outbox_pending_from(xid8, bigint, xid8[])", "outbox_pending_below(xid8, xid8, bigint, xid8[], xid8[])",
		"outbox_retry_next()", "outbox_stats()", "outbox_stamp(bigint[], text[], text[], smallint[])",
		"outbox_chain_blockers(text[], text[], bigint[], text[], boolean[], bigint[], bigint[], text[])",
	} {
		var lang string
		var config []string
		require.NoError(t, pool.QueryRow(ctx, `SELECT l.lanname, coalesce(p.proconfig, '{}') FROM pg_proc p
			JOIN pg_language l ON l.oid = p.prolang WHERE p.oid = $1::regprocedure`, fn).Scan(&lang, &config), fn)
		require.Equal(t, "plpgsql", lang, "%s: an SQL function plans its queries at every call", fn)
		require.Contains(t, config, "plan_cache_mode=force_generic_plan", fn)
	}
}

// The stamp's plan is kept for the session, so it must not rest on a
// partition's size when it was planned: a partition analyzed while empty,
// into which the ring then moves, is probed by primary key per row, not
// read whole per row until an analyze replans. auto_explain, at NOTICE,
// shows the kept plan the stamp runs.
func TestTheStampsKeptPlanProbesAPartitionAnalyzedEmpty(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	pool := testdb.Pool(t, url)
	var slot int16
	require.NoError(t, pool.QueryRow(ctx, "SELECT ((outbox_slot_of(now()) + 5) % 10)::smallint").Scan(&slot))
	exec(t, pool, "ANALYZE outbox_events")

	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		plans []string
	)
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		plans = append(plans, n.Message)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	stamp := func(seqs []int64) {
		docs, slots := make([]string, len(seqs)), make([]int16, len(seqs))
		for i := range seqs {
			docs[i], slots[i] = "{}", slot
		}
		_, err := conn.Exec(ctx, "SELECT outbox_stamp($1::bigint[], $2::text[], $3::text[], $4::smallint[])",
			seqs, docs, []string{}, slots)
		require.NoError(t, err)
	}
	stamp([]int64{}) // planned now, with the partition empty

	rows, err := pool.Query(ctx, `INSERT INTO outbox_events (id, type, slot)
		SELECT gen_random_uuid(), 'bulk', $1 FROM generate_series(1, 20000) RETURNING seq`, slot)
	require.NoError(t, err)
	all, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	seqs := all[:50]

	for _, s := range []string{"LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
		"SET auto_explain.log_nested_statements = on", "SET auto_explain.log_level = notice"} {
		_, err := conn.Exec(ctx, s)
		require.NoError(t, err)
	}
	stamp(seqs)
	mu.Lock()
	defer mu.Unlock()
	var stampPlan string
	for _, p := range plans {
		if strings.Contains(p, "Update on outbox_events") {
			stampPlan = p
		}
	}
	require.NotEmpty(t, stampPlan, "no plan of the stamp's UPDATE among %q", plans)
	part := fmt.Sprintf("outbox_events_%d", slot)
	require.NotContains(t, stampPlan, "Seq Scan on "+part, "the kept plan reads the partition whole, per row")
	require.Contains(t, stampPlan, part+"_pkey", "the kept plan probes the partition's primary key")
	var fanned int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE seq = ANY($1) AND fanned_out_at IS NOT NULL", seqs).Scan(&fanned))
	require.Equal(t, len(seqs), fanned)
}

// copyCounter counts the COPYs into river_job a pool starts (River's
// InsertManyFastTx; pgx reports a COPY to the connection's tracer).
type copyCounter struct{ n atomic.Int64 }

func (c *copyCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (c *copyCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *copyCounter) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceCopyFromStartData) context.Context {
	if len(d.TableName) > 0 && d.TableName[len(d.TableName)-1] == "river_job" {
		c.n.Add(1)
	}
	return ctx
}
func (c *copyCounter) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}

// copyCountingPool is a pool on a new database whose COPYs into river_job
// copies counts.
func copyCountingPool(t *testing.T) (string, *pgxpool.Pool, *copyCounter) {
	t.Helper()
	url := testdb.URL(t)
	copies := &copyCounter{}
	return url, poolWith(t, url, func(c *pgx.ConnConfig) { c.Tracer = copies }), copies
}

// manyEvents returns n events of type "a", subject "s<i>".
func manyEvents(n int) []Event {
	es := make([]Event, n)
	for i := range es {
		es[i] = Event{Type: "a", Subject: fmt.Sprintf("s%d", i)}
	}
	return es
}

// requireEachFanoutNamesItsJobs checks every event: fanned out, its fanout
// naming exactly subs, each by a job of that subscriber whose args carry the
// event's ID.
func requireEachFanoutNamesItsJobs(t *testing.T, pool *pgxpool.Pool, subs ...string) {
	t.Helper()
	jobs := loadJobs(t, pool)
	for id, row := range loadRows(t, pool) {
		require.True(t, row.FannedOut, "event %s not fanned out", id)
		require.Len(t, row.Fanout, len(subs), "event %s: fanout %v", id, row.Fanout)
		for _, sub := range subs {
			j, ok := jobs[row.Fanout[sub]]
			require.True(t, ok, "event %s: %s's job %d does not exist", id, sub, row.Fanout[sub])
			require.Equal(t, jobRow{ID: row.Fanout[sub], Subscriber: sub, EventID: id}, j,
				"event %s: its fanout names another event's or subscriber's job", id)
		}
	}
}

// A round with many jobs inserts them with River's COPY insert
// (InsertManyFastTx), and each event's fanout still names its own job of each
// subscriber: the IDs a COPY does not return are found after it. A round
// with few jobs inserts them with River's INSERT (fewer round trips).
func TestABigRoundInsertsItsJobsByCopyAndNamesEachJob(t *testing.T) {
	t.Parallel()
	url, pool, copies := copyCountingPool(t)
	b := setup(t, setupOpts{url: url, pool: pool, config: &RelayConfig{BatchSize: 100}},
		mapSub("audit", false, "**"), mapSub("mail", false, "**"), mapSub("search", false, "**"))
	b.record(t, manyEvents(250)...)
	b.start(t)
	waitFannedOut(t, b.pool, 30*time.Second)
	requireEachFanoutNamesItsJobs(t, b.pool, "audit", "mail", "search")
	require.Positive(t, copies.n.Load(), "no round inserted its jobs by COPY")

	b.settle(t)
	before := copies.n.Load()
	ev := b.record(t, Event{Type: "a", Subject: "alone"})[0]
	fannedWithin(t, b, ev.ID, 30*time.Second, "the lone event")
	requireEachFanoutNamesItsJobs(t, b.pool, "audit", "mail", "search")
	require.Equal(t, before, copies.n.Load(), "a round of 3 jobs inserted them by COPY")
}

// The jobs of a COPY take their IDs from river_job's sequence one row after
// the other, so jobs other transactions insert meanwhile can take IDs
// between them: the round's lookup of its IDs must step over those. Here a
// trigger holds the COPY at the batch's middle event (on an advisory lock
// the test holds) while another transaction inserts and commits jobs.
func TestJobsInsertedByCopyAreToldFromJobsInsertedMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, copies := copyCountingPool(t)
	b := setup(t, setupOpts{url: url, pool: pool, config: &RelayConfig{BatchSize: 100, MaxRoundsInFlight: 1}},
		mapSub("audit", false, "**"))
	_, err := b.pool.Exec(ctx, `
		CREATE FUNCTION hold_marked_job() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.args->>'subject' = 'hold' THEN PERFORM pg_advisory_xact_lock_shared(4242); END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER hold_marked_job BEFORE INSERT ON river_job FOR EACH ROW EXECUTE FUNCTION hold_marked_job()`)
	require.NoError(t, err)
	holder, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(ctx, "SELECT pg_advisory_lock(4242)")
	require.NoError(t, err)

	es := manyEvents(100)
	es[50].Subject = "hold"
	b.record(t, es...)
	b.start(t)
	require.Eventually(t, func() bool {
		var waiting bool
		err := b.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND NOT granted)").Scan(&waiting)
		return err == nil && waiting
	}, 30*time.Second, 5*time.Millisecond, "the round's COPY never reached the held event")
	others := make([]river.InsertManyParams, 5)
	for i := range others {
		others[i] = river.InsertManyParams{Args: testArgs{EventID: uuid.New(), Subject: "other"}}
	}
	_, err = b.client.InsertMany(ctx, others)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, "SELECT pg_advisory_unlock(4242)")
	require.NoError(t, err)

	waitFannedOut(t, b.pool, 30*time.Second)
	requireEachFanoutNamesItsJobs(t, b.pool, "audit")
	require.Positive(t, copies.n.Load(), "the round did not insert by COPY")
	var between int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM river_job o,
		(SELECT min(id) lo, max(id) hi FROM river_job WHERE args->>'subject' <> 'other') r
		WHERE o.args->>'subject' = 'other' AND o.id BETWEEN r.lo AND r.hi`).Scan(&between))
	require.Equal(t, len(others), between, "the other jobs' IDs are not among the round's")
}

// uniqueArgs is a job args type that asks River for uniqueness itself.
type uniqueArgs struct {
	Subject string `json:"subject"`
}

func (uniqueArgs) Kind() string { return "test.unique" }
func (uniqueArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// A unique job is inserted with River's INSERT, which skips a duplicate and
// returns the job it duplicates, never by COPY (which fails on one): events
// that map to one unique job share it, whether the subscriber's options or
// the args' own ask for uniqueness.
func TestUniqueJobsAreNeverInsertedByCopy(t *testing.T) {
	t.Parallel()
	for name, sub := range map[string]Subscriber{
		"subscriber's options": {Name: "digest", Types: []string{"**"},
			Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
				return testArgs{Subject: e.Subject[:2]}, &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}, nil
			}},
		"args' own options": {Name: "digest", Types: []string{"**"},
			Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
				return uniqueArgs{Subject: e.Subject[:2]}, nil, nil
			}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url, pool, copies := copyCountingPool(t)
			b := setup(t, setupOpts{url: url, pool: pool, config: &RelayConfig{BatchSize: 100}}, sub)
			recorded := b.record(t, manyEvents(100)...) // subjects s0…s99: ten prefixes
			b.start(t)
			waitFannedOut(t, b.pool, 30*time.Second)
			require.Zero(t, copies.n.Load(), "unique jobs were inserted by COPY")
			var jobs int
			require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM river_job").Scan(&jobs))
			require.Equal(t, 10, jobs, "one unique job per subject prefix")
			rows := loadRows(t, b.pool)
			byPrefix := map[string]int64{}
			for _, e := range recorded {
				id, ok := rows[e.ID].Fanout["digest"]
				require.True(t, ok, "event %s names no job", e.Subject)
				if first, seen := byPrefix[e.Subject[:2]]; seen {
					require.Equal(t, first, id, "events of one prefix name different jobs")
				}
				byPrefix[e.Subject[:2]] = id
			}
		})
	}
}

// kindRenamer is an insert middleware that changes every job's kind: what a
// COPY inserted then differs from what the round planned.
type kindRenamer struct{ river.MiddlewareDefaults }

func (*kindRenamer) InsertMany(ctx context.Context, params []*rivertype.JobInsertParams,
	doInner func(context.Context) ([]*rivertype.JobInsertResult, error),
) ([]*rivertype.JobInsertResult, error) {
	for _, p := range params {
		p.Kind = "renamed." + p.Kind
	}
	return doInner(ctx)
}

// When the jobs a COPY inserted are not the round's (here an insert
// middleware renamed their kinds), the round fails without naming a wrong
// job, its rows are fanned out job by job with River's INSERT, the relay
// warns once, and its later rounds insert with River's INSERT.
func TestACopyWhoseJobsAreNotTheRoundsFallsBackToRiversInsert(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, logs := fallBackOnceThrough(t, &kindRenamer{})
	require.Equal(t, 1, strings.Count(logs.String(), "could not be told apart"), "logs: %s", logs.String())
	var unrenamed int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE kind NOT LIKE 'renamed.%'").Scan(&unrenamed))
	require.Zero(t, unrenamed)
}

// A round whose COPY fails because of one job's own host code (here the job
// args' MarshalJSON panics for one event) is retried row by row; that row
// fails with River's INSERT too, so the fault is the row's: COPY stays on
// for the rounds after it, and nothing is logged about it.
func TestAJobThatFailsOnItsOwnInACopiedRoundLeavesCopyOn(t *testing.T) {
	t.Parallel()
	url, pool, copies := copyCountingPool(t)
	var logs syncBuffer
	b := setup(t, setupOpts{url: url, pool: pool, config: oneBadRowConfig(&logs)}, panicSub("marshals", false, false))
	b.record(t, batchWithOneBadRow()...)
	b.start(t)
	waitFannedOut(t, b.pool, 30*time.Second)
	requireCopyStaysOn(t, b, copies, &logs, "one poison event")
}

// nilResultRefuser is a host's insert middleware that checks River's
// results and returns an error (rather than panicking) on a nil one, as a
// COPY insert returns.
type nilResultRefuser struct{ river.MiddlewareDefaults }

func (*nilResultRefuser) InsertMany(ctx context.Context, _ []*rivertype.JobInsertParams,
	doInner func(context.Context) ([]*rivertype.JobInsertResult, error),
) ([]*rivertype.JobInsertResult, error) {
	res, err := doInner(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range res {
		if r == nil || r.Job == nil {
			return nil, errors.New("nilResultRefuser: River returned no job")
		}
	}
	return res, nil
}

// An insert middleware that refuses the nil results a COPY returns (with an
// error, not a panic) fails the first big round; its rows, retried row by
// row, go in with River's INSERT, so the fault was COPY's: the relay warns
// once and inserts with InsertManyTx from then on, rather than fail (and
// back off) at every big round.
func TestAMiddlewareThatRefusesCopysResultsTurnsCopyOffOnce(t *testing.T) {
	t.Parallel()
	_, logs := fallBackOnceThrough(t, &nilResultRefuser{})
	require.Equal(t, 1, strings.Count(logs.String(), "relay round failed"), "rounds kept failing")
	require.Equal(t, 1, strings.Count(logs.String(), "InsertManyTx from now on"), "logs: %s", logs.String())
}

// countingPilot is a River pilot (the plugin point River Pro's drivers
// fill) that counts the jobs River inserts through it.
type countingPilot struct {
	riverpilot.StandardPilot
	jobs atomic.Int64
}

func (p *countingPilot) JobInsertMany(ctx context.Context, execTx riverdriver.ExecutorTx,
	params *riverdriver.JobInsertFastManyParams,
) ([]*riverdriver.JobInsertFastResult, error) {
	p.jobs.Add(int64(len(params.Jobs)))
	return p.StandardPilot.JobInsertMany(ctx, execTx, params)
}

// pilotDriver is riverpgxv5's driver with a pilot of its own, as a plugin
// driver (River Pro's) has.
type pilotDriver struct {
	*riverpgxv5.Driver
	pilot *countingPilot
}

func (*pilotDriver) PluginInit(*baseservice.Archetype) {}
func (d *pilotDriver) PluginPilot() riverpilot.Pilot   { return d.pilot }

// River's COPY insert calls the driver itself, not the client's pilot,
// whose JobInsertMany "must keep related writes" in the transaction: with a
// driver that brings a pilot of its own (River Pro's), every job of the
// relay goes through it (no COPY).
func TestAPluginDriversPilotSeesEveryJob(t *testing.T) {
	t.Parallel()
	url, pool, copies := copyCountingPool(t)
	b := setup(t, setupOpts{url: url, pool: pool, config: &RelayConfig{BatchSize: 100, MaxRoundsInFlight: 1}},
		mapSub("audit", false, "**"))
	pilot := &countingPilot{}
	var err error
	b.client, err = river.NewClient[pgx.Tx](&pilotDriver{Driver: riverpgxv5.New(b.pool), pilot: pilot},
		&river.Config{Logger: quietLogger()})
	require.NoError(t, err)
	b.record(t, manyEvents(100)...)
	b.start(t)
	waitFannedOut(t, b.pool, 30*time.Second)
	requireEachFanoutNamesItsJobs(t, b.pool, "audit")
	require.Equal(t, int64(100), pilot.jobs.Load(), "jobs inserted around the client's pilot (COPYs: %d)", copies.n.Load())
}

// A relay of a named schema (with River's tables there as well as in
// public, each with its own sequence) inserts its big rounds by COPY into
// the schema's river_job and finds their IDs there.
func TestABigRoundInANamedSchemaInsertsByCopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool, copies := copyCountingPool(t)
	billing := Outbox{Schema: "billing"}
	require.NoError(t, billing.Migrate(ctx, pool))
	// public.river_job's sequence far ahead of billing's.
	exec(t, pool, "SELECT setval('public.river_job_id_seq', 100000)")
	var logs syncBuffer
	cfg := copyRoundConfig(&logs)
	cfg.Outbox = billing
	relay, err := NewRelay(pool, cfg)
	require.NoError(t, err)
	require.NoError(t, relay.Subscribe(mapSub("audit", false, "**")))
	require.NoError(t, relay.Subscribe(mapSub("mail", false, "**")))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quietLogger(), Schema: "billing"})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := billing.RecordMany(ctx, tx, manyEvents(150))
		return err
	}))
	require.NoError(t, relay.Start(ctx, client))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, relay.Stop(sctx))
	})
	require.Eventually(t, func() bool {
		var pending int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM billing.outbox_events WHERE fanned_out_at IS NULL").Scan(&pending)
		return err == nil && pending == 0
	}, 30*time.Second, 10*time.Millisecond)
	var bad int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM billing.outbox_events e, jsonb_each_text(e.fanout) f
		WHERE NOT EXISTS (SELECT 1 FROM billing.river_job j WHERE j.id = f.value::bigint
		                    AND j.args->>'event_id' = e.id::text AND ('events-subscriber-' || f.key) = ANY(j.tags))`).Scan(&bad))
	require.Zero(t, bad, "fanouts naming another event's or subscriber's job")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM billing.outbox_events WHERE (SELECT count(*) FROM jsonb_each(fanout)) <> 2`).Scan(&bad))
	require.Zero(t, bad)
	require.Positive(t, copies.n.Load())
	require.NotContains(t, logs.String(), "InsertManyTx from now on")
}

// Through PgBouncer in transaction mode (exec and simple protocol), a big
// round inserts by COPY and names its jobs.
func TestABigRoundThroughPgBouncerInsertsByCopy(t *testing.T) {
	t.Parallel()
	for name, mode := range map[string]pgx.QueryExecMode{"exec": pgx.QueryExecModeExec, "simple protocol": pgx.QueryExecModeSimpleProtocol} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			url := testdb.URL(t)
			copies := &copyCounter{}
			pool := poolWith(t, testdb.PgBouncer(t).URL(url), func(c *pgx.ConnConfig) {
				c.Tracer, c.DefaultQueryExecMode = copies, mode
			})
			var logs syncBuffer
			b := setup(t, setupOpts{url: url, pool: pool, config: &RelayConfig{BatchSize: 100,
				Listener: ListenerConfig{PollOnly: true, PollInterval: 50 * time.Millisecond},
				Logger:   slog.New(slog.NewTextHandler(&logs, nil))}},
				mapSub("audit", false, "**"), mapSub("mail", false, "**"))
			b.record(t, manyEvents(200)...)
			b.start(t)
			waitFannedOut(t, b.pool, 30*time.Second)
			requireEachFanoutNamesItsJobs(t, b.pool, "audit", "mail")
			require.Positive(t, copies.n.Load())
			require.NotContains(t, logs.String(), "InsertManyTx from now on")
		})
	}
}

// Ordered subscribers' big rounds (a coalescing one, whose chains the round
// locks first, and one appended late) insert by COPY, and every chain link
// (outbox_chain_jobs) names the job of its own event.
func TestOrderedChainsOfACopiedRoundNameTheirJobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, copies := copyCountingPool(t)
	var logs syncBuffer
	ordered := mapSub("ordered", false, "**")
	ordered.Ordered = true
	coalescing := mapSub("latest", true, "**")
	coalescing.Ordered = true
	b := setup(t, setupOpts{url: url, pool: pool, config: copyRoundConfig(&logs)}, ordered, coalescing, mapSub("audit", false, "**"))
	es := make([]Event, 200)
	for i := range es {
		es[i] = Event{Type: "a", Subject: fmt.Sprint("subj", i%40)}
	}
	b.record(t, es...)
	b.start(t)
	waitFannedOut(t, b.pool, 30*time.Second)
	require.Positive(t, copies.n.Load())
	require.NotContains(t, logs.String(), "InsertManyTx from now on")
	var bad, links int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE j.id IS NULL OR j.args->>'event_id' <> l.event_id::text
		                                      OR NOT ('events-subscriber-' || l.subscriber) = ANY(j.tags)), count(*)
		FROM outbox_chain_jobs l LEFT JOIN river_job j ON j.id = l.job_id`).Scan(&bad, &links))
	require.Positive(t, links)
	require.Zero(t, bad, "chain links naming another event's or subscriber's job")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events e, jsonb_each_text(e.fanout) f
		WHERE NOT EXISTS (SELECT 1 FROM river_job j WHERE j.id = f.value::bigint AND ('events-subscriber-' || f.key) = ANY(j.tags)
		                    AND j.args->>'subject' = e.subject)`).Scan(&bad))
	require.Zero(t, bad, "fanouts naming another subject's or subscriber's job")
}

// Two relays of one database and a writer of River jobs, all at once, with
// river_job's sequence caching values per session (so IDs of different
// sessions are not in commit or even draw order): every fanout names its
// own event's jobs.
func TestCopiedRoundsOfTwoRelaysBesideAWriterNameTheirJobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, copies := copyCountingPool(t)
	exec(t, pool, "ALTER SEQUENCE river_job_id_seq CACHE 7")
	subs := []Subscriber{mapSub("audit", false, "**"), mapSub("mail", false, "**"), mapSub("search", false, "**")}
	var logs syncBuffer
	cfg := func() *RelayConfig {
		return &RelayConfig{BatchSize: 100, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	}
	b1 := setup(t, setupOpts{url: url, pool: pool, config: cfg()}, subs...)
	copies2 := &copyCounter{}
	pool2 := poolWith(t, url, func(c *pgx.ConnConfig) { c.Tracer = copies2 })
	b2 := setup(t, setupOpts{url: url, pool: pool2, config: cfg()}, subs...)
	b1.record(t, manyEvents(1500)...)

	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		for wctx.Err() == nil {
			others := make([]river.InsertManyParams, 7)
			for i := range others {
				others[i] = river.InsertManyParams{Args: testArgs{Subject: "other"}}
			}
			if _, err := b1.client.InsertMany(wctx, others); err != nil && wctx.Err() == nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	b1.start(t)
	b2.start(t)
	for range 5 {
		b1.record(t, manyEvents(300)...)
	}
	waitFannedOut(t, b1.pool, 60*time.Second)
	stop()
	require.NoError(t, <-done)
	requireEachFanoutNamesItsJobs(t, b1.pool, "audit", "mail", "search")
	require.Positive(t, copies.n.Load())
	require.Positive(t, copies2.n.Load(), "the second relay never inserted by COPY")
	require.NotContains(t, logs.String(), "InsertManyTx from now on")
}

// The row-by-row retry that tells a COPY's failure from a row's inserts with
// River's INSERT, even for an event of 32 jobs (32 subscribers): were its
// one-row rounds copied too, each would fail like the batch with an insert
// middleware that refuses COPY's nil results, count as the row's fault, and
// leave COPY on, every later big round failing and backing off for the run.
func TestAnEventOf32JobsDoesNotKeepAFailingCopyOn(t *testing.T) {
	t.Parallel()
	url, pool, copies := copyCountingPool(t)
	var logs syncBuffer
	cfg := copyRoundConfig(&logs)
	subs := make([]Subscriber, 32)
	names := make([]string, len(subs))
	for i := range subs {
		names[i] = fmt.Sprintf("sub%02d", i)
		subs[i] = mapSub(names[i], false, "**")
	}
	b := setup(t, setupOpts{url: url, pool: pool, config: cfg}, subs...)
	useInsertMiddleware(t, b, &nilResultRefuser{})
	b.record(t, manyEvents(5)...) // 160 jobs: one COPY round
	b.start(t)
	waitFannedOut(t, b.pool, 60*time.Second)
	requireEachFanoutNamesItsJobs(t, b.pool, names...)
	before := copies.n.Load()

	b.record(t, manyEvents(5)...)
	waitFannedOut(t, b.pool, 60*time.Second)
	requireEachFanoutNamesItsJobs(t, b.pool, names...)
	require.Equal(t, before, copies.n.Load(), "COPY was tried again after it failed where River's INSERT did not; logs: %s", logs.String())
	require.Equal(t, 1, strings.Count(logs.String(), "relay round failed"), "big rounds keep failing: logs: %s", logs.String())
	require.Equal(t, 1, strings.Count(logs.String(), "InsertManyTx from now on"), "logs: %s", logs.String())
}

// A COPY round that fails for the database's sake (here a deadlock, 40P01,
// raised once by a trigger; equally a statement or lock timeout) blames
// neither its rows nor COPY: the rows' retry succeeds, and COPY stays on.
func TestADatabaseFailureOfACopiedRoundLeavesCopyOn(t *testing.T) {
	t.Parallel()
	url, pool, copies := copyCountingPool(t)
	exec(t, pool, `
		CREATE SEQUENCE copyreview_fail_once;
		CREATE FUNCTION copyreview_fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('copyreview_fail_once') = 1 THEN
				RAISE EXCEPTION 'simulated deadlock' USING ERRCODE = 'deadlock_detected';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER copyreview_fail_once BEFORE INSERT ON river_job FOR EACH ROW EXECUTE FUNCTION copyreview_fail_once()`)
	var logs syncBuffer
	b := setup(t, setupOpts{url: url, pool: pool, config: copyRoundConfig(&logs)}, mapSub("audit", false, "**"))
	b.record(t, manyEvents(100)...)
	b.start(t)
	waitFannedOut(t, b.pool, 60*time.Second)
	require.Contains(t, logs.String(), "simulated deadlock", "the first round did not fail")
	before := copies.n.Load()

	b.record(t, manyEvents(100)...)
	waitFannedOut(t, b.pool, 60*time.Second)
	requireEachFanoutNamesItsJobs(t, b.pool, "audit")
	require.NotContains(t, logs.String(), "InsertManyTx from now on", "a deadlock was blamed on COPY")
	require.Greater(t, copies.n.Load(), before, "after one deadlock no round inserts by COPY any more")
}

// The row whose job made a COPY round fail is charged (here poisoned) by
// another relay, or held by another round, while this relay backs off: this
// relay's row-by-row retry cannot claim it, so it cannot tell whether the
// row was at fault, and COPY stays on.
func TestABadRowTakenByAnotherRelayDoesNotTurnCopyOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, copies := copyCountingPool(t)
	var logs syncBuffer
	b := setup(t, setupOpts{url: url, pool: pool, config: oneBadRowConfig(&logs)}, panicSub("marshals", false, false))
	es := batchWithOneBadRow()
	es = b.record(t, es...)
	bad := es[50].ID
	var once sync.Once
	b.relay.eng.Hooks.Pause = func(context.Context, time.Duration) bool {
		once.Do(func() {
			// What another relay's row-by-row retry does meanwhile (Charge,
			// at MaxAttempts 1).
			_, err := b.pool.Exec(ctx, `UPDATE outbox_events SET attempts = attempts + 1, last_error = 'charged by another relay',
				next_attempt_at = now(), poisoned_at = now() WHERE id = $1 AND fanned_out_at IS NULL AND poisoned_at IS NULL`, bad)
			if err != nil {
				panic(err)
			}
		})
		return true
	}
	b.start(t)
	waitFannedOut(t, b.pool, 30*time.Second)
	requireCopyStaysOn(t, b, copies, &logs, "one poison event, charged elsewhere,")
}

// A graceful Stop during the row-by-row retry ends it before the row at
// fault (its job args' MarshalJSON panics) is retried: the rows retried so
// far prove nothing against COPY, and the stopping relay blames nothing on
// it.
func TestAStopDuringTheRowByRowRetryBlamesNothingOnCopy(t *testing.T) {
	t.Parallel()
	url, pool, _ := copyCountingPool(t)
	var logs syncBuffer
	b := setup(t, setupOpts{url: url, pool: pool, config: oneBadRowConfig(&logs)}, panicSub("marshals", false, false))
	es := batchWithOneBadRow()
	b.record(t, es...)
	stopped := make(chan error, 1)
	var once sync.Once
	b.relay.eng.Hooks.AfterInsert = func(context.Context, pgx.Tx) {
		// The first round that inserts is the row-by-row retry's first row
		// (the batch round failed in its COPY).
		once.Do(func() {
			run := b.relay.svc.Current()
			go func() {
				sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				stopped <- b.relay.Stop(sctx)
			}()
			<-run.Stopping()
		})
	}
	b.start(t)
	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the relay never stopped")
	}
	require.Contains(t, logs.String(), "relay round failed", "the batch round did not fail")
	require.NotContains(t, logs.String(), "InsertManyTx from now on", "a stop mid retry blamed COPY")
}

// batchWithOneBadRow is a batch of 100 events for panicSub, the 51st of
// whose job args' MarshalJSON panics: in River's COPY and in its INSERT
// alike.
func batchWithOneBadRow() []Event {
	es := make([]Event, 100)
	for i := range es {
		es[i] = panicEvent(fmt.Sprint("s", i), "")
	}
	es[50] = panicEvent("boom", "marshal")
	return es
}

// copyRoundConfig is the COPY tests' relay: it claims up to 100 events in
// one round (a COPY's size), one round at a time, backs off 5 ms after a
// failed round, and logs to logs.
func copyRoundConfig(logs *syncBuffer) *RelayConfig {
	return &RelayConfig{BatchSize: 100, MaxRoundsInFlight: 1, RetryBackoff: 5 * time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))}
}

// oneBadRowConfig is copyRoundConfig poisoning a row at its first failure:
// batchWithOneBadRow's relay.
func oneBadRowConfig(logs *syncBuffer) *RelayConfig {
	cfg := copyRoundConfig(logs)
	cfg.MaxAttempts = 1
	return cfg
}

// fallBackOnceThrough drains 300 events of one subscriber through a River
// client whose insert middleware is mw, which makes the first COPY fail, and
// requires every event fanned out to its own job and no COPY after that
// first: the relay fell back to River's INSERT for the run. It returns the
// bundle and the relay's logs.
func fallBackOnceThrough(t *testing.T, mw rivertype.Middleware) (*testBundle, *syncBuffer) {
	t.Helper()
	url, pool, copies := copyCountingPool(t)
	logs := &syncBuffer{}
	b := setup(t, setupOpts{url: url, pool: pool, config: copyRoundConfig(logs)}, mapSub("audit", false, "**"))
	useInsertMiddleware(t, b, mw)
	b.record(t, manyEvents(300)...)
	b.start(t)
	waitFannedOut(t, b.pool, 60*time.Second)
	requireEachFanoutNamesItsJobs(t, b.pool, "audit")
	require.Equal(t, int64(1), copies.n.Load(), "COPY was tried again after it failed; logs: %s", logs.String())
	return b, logs
}

// useInsertMiddleware gives b a River client whose only middleware is mw.
func useInsertMiddleware(t *testing.T, b *testBundle, mw rivertype.Middleware) {
	t.Helper()
	var err error
	b.client, err = river.NewClient(riverpgxv5.New(b.pool), &river.Config{Logger: quietLogger(), Middleware: []rivertype.Middleware{mw}})
	require.NoError(t, err)
}

// requireCopyStaysOn records another batch for panicSub after what (a
// failure) and requires it inserted by COPY, with no fallback logged.
func requireCopyStaysOn(t *testing.T, b *testBundle, copies *copyCounter, logs *syncBuffer, what string) {
	t.Helper()
	before := copies.n.Load()
	later := make([]Event, 100)
	for i := range later {
		later[i] = panicEvent(fmt.Sprint("later", i), "")
	}
	b.record(t, later...)
	waitFannedOut(t, b.pool, 30*time.Second)
	require.NotContains(t, logs.String(), "InsertManyTx from now on", "%s turned COPY off", what)
	require.Greater(t, copies.n.Load(), before, "after %s no round inserts by COPY any more", what)
}
