package events

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

// Review of the quiet watch triggers (migration 010) and the doubling
// re-check schedule.

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
