package events

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

// Review of the quiet watch triggers (migration 010) and the doubling
// re-check schedule.

// A pending row that another session holds locked (a relay of another
// process whose round is stuck mid-transaction — its host paused, or its
// network path gone silent so the server keeps the backend and its locks —
// or a host's FanOutTx in a long transaction) is reported by every poll
// ("pending rows wait") but skipped by every claim (SKIP LOCKED). A re-check
// that finds it leads to a claim of nothing, and the pass after that neither
// resets nor doubles the lull (a re-check doubles it only when the poll
// itself finds nothing): the relay re-checks every 2 ms for as long as
// the lock is held — a poll, an empty batch round and a deliveries-lane
// query every couple of milliseconds, per relay, indefinitely. (Before,
// the trailing window ended 15 ms after the wake-up.)
func TestReview21ALockedPendingRowDoesNotMakeTheRelaySpin(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{config: &RelayConfig{Listener: ListenerConfig{PollInterval: time.Hour}}}, mapSub("audit", false, "**"))
	var polls atomic.Int64
	b.relay.hooks.polled = func() { polls.Add(1) }
	b.start(t)
	b.quiesce(t)

	holdAPendingRow(t, b)

	before := polls.Load()
	time.Sleep(2 * time.Second) // a window to count the looks in
	looks := polls.Load() - before
	t.Logf("%d looks in the 2 s after an event, while another session holds a pending row", looks)
	// The bound of TestTheRechecksSlowDownWhenIdle: every 2 ms for 16 ms,
	// then 4 ms, 8 ms, … 512 ms.
	require.LessOrEqual(t, looks, int64(30),
		"a locked pending row keeps the relay re-checking at its first lull forever: the schedule must thin out when the claims find nothing")
}

// holdAPendingRow inserts a pending row without a notification and locks it
// from another transaction until t ends, as a round in flight would hold it;
// then it records one notified event and waits until it is fanned out. From
// then on the relay is active, and every look it takes sees the locked row.
func holdAPendingRow(t *testing.T, b *testBundle) {
	t.Helper()
	ctx := context.Background()
	held := uuid.Must(uuid.NewV7())
	exec(t, b.pool, "INSERT INTO outbox_events (id, type) VALUES ($1, 'held')", held)
	locker, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Rollback(context.Background()) })
	_, err = locker.Exec(ctx, "SELECT 1 FROM outbox_events WHERE id = $1 FOR UPDATE", held)
	require.NoError(t, err)

	var loud Event
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		loud, err = Outbox{NotifyInterval: NotifyEveryTransaction}.Record(ctx, tx, Event{Type: "loud"})
		return err
	}))
	fannedWithin(t, b, loud.ID, 5*time.Second, "the notified event")
}

// Migration 010's DO block writes its regular expressions as ordinary
// string literals with backslashes ('…outbox_notify\(\);'). A session with
// standard_conforming_strings off (a legacy database or role setting, or a
// migration tool's session) reads '\(' as '(', so the expressions match
// nothing, and the up migration "succeeds" while every watch's own function
// keeps notifying. (Dollar-quoted or E-prefixed literals read the same either way;
// the library's Literal already guards against this setting.)
func TestReview21Migration10QuietsOwnFunctionsWithStandardConformingStringsOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	v10 := migration10(t)
	createNotes(t, pool, 1)
	require.NoError(t, outbox.InstallWatch(ctx, pool, Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed"}}))
	_, err := pool.Exec(ctx, v10.down)
	require.NoError(t, err)
	notifying, _, _ := watchFunctionsNotify(t, pool, "public")
	require.True(t, notifying, "precondition: version 9's function notifies")

	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL standard_conforming_strings = off"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, v10.up)
		return err
	}), "migration 10's up with standard_conforming_strings off")
	notifying, generic, _ := watchFunctionsNotify(t, pool, "public")
	require.False(t, generic, "the generic function is rewritten whatever the setting")
	require.False(t, notifying, "with standard_conforming_strings off, migration 10 leaves every watch's own function notifying")
}

// Guard (passes): migration 010 both ways in a named schema that needs
// quoting, run as Migrate runs it (search_path set to the schema): the
// own functions qualify outbox_notify() with the quoted schema.
func TestReview21Migration10InAMixedCaseSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const schema = "Billing_EU"
	pool := testdb.Pool(t, testdb.EmptyURL(t))
	o := Outbox{Schema: schema}
	require.NoError(t, o.Migrate(ctx, pool))
	v10 := migration10(t)
	_, err := pool.Exec(ctx, "CREATE TABLE corpus_notes (id int PRIMARY KEY, title text NOT NULL); INSERT INTO corpus_notes VALUES (1, 't')")
	require.NoError(t, err)
	require.NoError(t, o.InstallWatch(ctx, pool, Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed"}}))
	run := func(file string) {
		t.Helper()
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT set_config('search_path', $1, true)", pgx.Identifier{schema}.Sanitize()); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, file)
			return err
		}))
	}
	notifying, _, n := watchFunctionsNotify(t, pool, schema)
	require.Equal(t, 1, n)
	require.False(t, notifying)
	run(v10.down)
	notifying, _, _ = watchFunctionsNotify(t, pool, schema)
	require.True(t, notifying, "the down migration puts the notification back")
	_, err = pool.Exec(ctx, "UPDATE corpus_notes SET title = title || '!'")
	require.NoError(t, err, "the function the down migration wrote runs")
	run(v10.up)
	notifying, _, _ = watchFunctionsNotify(t, pool, schema)
	require.False(t, notifying, "the up migration takes it out")
	_, err = pool.Exec(ctx, "UPDATE corpus_notes SET title = title || '!'")
	require.NoError(t, err)
	var events int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "Billing_EU".outbox_events WHERE type = 'note.changed'`).Scan(&events))
	require.Equal(t, 2, events)
}

// Guard (passes): migration 010's DO block skips a watch function owned by
// a role the migrating role does not act as, instead of failing the
// migration, and still quiets the ones it owns.
func TestReview21Migration10SkipsAnotherRolesWatchFunction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	v10 := migration10(t)
	createNotes(t, pool, 2)
	exec(t, pool, "CREATE TABLE corpus_other (id int PRIMARY KEY, title text NOT NULL)")
	require.NoError(t, outbox.InstallWatch(ctx, pool, Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed"}}))
	require.NoError(t, outbox.InstallWatch(ctx, pool, Watch{Table: "corpus_other", Types: map[Op]string{OpInsert: "other.created"}}))
	_, err := pool.Exec(ctx, v10.down)
	require.NoError(t, err)

	// Roles are cluster-wide: names of this test's own.
	migrator := pgx.Identifier{"migrator_" + uuid.NewString()[:8]}.Sanitize()
	stranger := pgx.Identifier{"stranger_" + uuid.NewString()[:8]}.Sanitize()
	for _, role := range []string{migrator, stranger} {
		exec(t, pool, "CREATE ROLE "+role+" NOLOGIN")
	}
	t.Cleanup(func() {
		for _, role := range []string{migrator, stranger} {
			_, _ = pool.Exec(context.Background(), "REASSIGN OWNED BY "+role+" TO CURRENT_USER")
			_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+role)
			_, _ = pool.Exec(context.Background(), "DROP ROLE "+role)
		}
	})
	exec(t, pool, "GRANT CREATE, USAGE ON SCHEMA public TO "+migrator)
	exec(t, pool, "ALTER FUNCTION outbox_watch() OWNER TO "+migrator)
	var strangers, mine string
	require.NoError(t, pool.QueryRow(ctx, `SELECT p.oid::regprocedure::text FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
		WHERE t.tgrelid = 'corpus_other'::regclass`).Scan(&strangers))
	require.NoError(t, pool.QueryRow(ctx, `SELECT p.oid::regprocedure::text FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
		WHERE t.tgrelid = 'corpus_notes'::regclass`).Scan(&mine))
	exec(t, pool, "ALTER FUNCTION "+strangers+" OWNER TO "+stranger)
	exec(t, pool, "ALTER FUNCTION "+mine+" OWNER TO "+migrator)

	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+migrator); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, v10.up)
		return err
	}), "migration 10 as a role that does not own every watch function")
	quiet := func(fn string) bool {
		var q bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT prosrc !~ 'outbox_notify' FROM pg_proc WHERE oid = $1::regprocedure", fn).Scan(&q))
		return q
	}
	require.True(t, quiet(mine), "the migrating role's own function is quieted")
	require.False(t, quiet(strangers), "another role's function is left as it was")
	require.True(t, quiet("outbox_watch()"))
	exec(t, pool, "UPDATE corpus_notes SET title = title || '!'")
	exec(t, pool, "INSERT INTO corpus_other VALUES (1, 'x')")
	require.Len(t, eventsOfType(t, pool, "note.changed"), 2)
	require.Len(t, eventsOfType(t, pool, "other.created"), 1)
}
