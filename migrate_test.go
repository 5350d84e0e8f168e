package events

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/statements"
	"github.com/standmeet/events/internal/testdb"
)

func TestMigrateConcurrentlyAndTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.EmptyURL(t))
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = outbox.Migrate(ctx, pool)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, outbox.Migrate(ctx, pool))
	var versions int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox_migration").Scan(&versions))
	files, err := loadMigrations()
	require.NoError(t, err)
	require.Equal(t, len(files), versions)
	var riverVersions int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM river_migration").Scan(&riverVersions))
	require.Positive(t, riverVersions)
}

// The SQL files stand on their own, for teams using their own migration tool:
// every down undoes its up.
func TestMigrationFilesGoDownAndUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	files, err := loadMigrations()
	require.NoError(t, err)
	for i := len(files) - 1; i >= 0; i-- {
		require.NotEmpty(t, files[i].down, "version %d has no down file", files[i].version)
		_, err := pool.Exec(ctx, files[i].down)
		require.NoError(t, err)
	}
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass('outbox_events') IS NOT NULL").Scan(&exists))
	require.False(t, exists)
	for _, f := range files {
		_, err := pool.Exec(ctx, f.up)
		require.NoError(t, err)
	}
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass('outbox_events') IS NOT NULL").Scan(&exists))
	require.True(t, exists)
}

func TestMigrateRefusesABadSchema(t *testing.T) {
	t.Parallel()
	err := Outbox{Schema: "bad-name"}.Migrate(context.Background(), testdb.New(t))
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.Contains(t, err.Error(), "Schema")
}

// Version 10 takes the notification out of the watch functions installed
// before it (each watch's own, and the generic one) and its down puts it
// back; both ways the triggers record the same rows.
func TestMigration10QuietsInstalledWatchFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	v10 := migration10(t)
	createNotes(t, pool, 1)
	require.NoError(t, Outbox{}.InstallWatch(ctx, pool, Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed"}}))
	exec(t, pool, "UPDATE outbox_settings SET notify_interval = '0'")
	conn, err := pgx.Connect(ctx, pool.Config().ConnConfig.ConnString())
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "LISTEN "+statements.ChannelEvents)
	require.NoError(t, err)
	// write updates the watched row and reports whether a notification came:
	// a sentinel sent after the update's commit arrives after the update's
	// notification, if there is one (notifications are delivered in commit
	// order), so no clock decides.
	write := func() bool {
		t.Helper()
		exec(t, pool, "UPDATE corpus_notes SET title = title || '!' WHERE id = 1")
		exec(t, pool, "SELECT pg_notify($1, 'sentinel')", statements.ChannelEvents)
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		n, err := conn.WaitForNotification(wctx)
		require.NoError(t, err, "not even the sentinel came")
		if n.Payload == "sentinel" {
			return false
		}
		n, err = conn.WaitForNotification(wctx)
		require.NoError(t, err)
		require.Equal(t, "sentinel", n.Payload, "one notification per write")
		return true
	}

	own, generic, _ := watchFunctionsNotify(t, pool, "public")
	require.False(t, own || generic, "version 10's functions notify")
	require.False(t, write())

	_, err = pool.Exec(ctx, v10.down)
	require.NoError(t, err)
	own, generic, _ = watchFunctionsNotify(t, pool, "public")
	require.True(t, own && generic, "the down migration does not put the notification back")
	require.True(t, write(), "the watch function of version 9 notifies")

	_, err = pool.Exec(ctx, v10.up)
	require.NoError(t, err)
	own, generic, _ = watchFunctionsNotify(t, pool, "public")
	require.False(t, own || generic, "the up migration leaves a notification in")
	require.False(t, write())
	require.Len(t, eventsOfType(t, pool, "note.changed"), 3)
}

// migration10 returns migration 010's files.
func migration10(t *testing.T) migrationFile {
	t.Helper()
	files, err := loadMigrations()
	require.NoError(t, err)
	for _, f := range files {
		if f.version == 10 {
			return f
		}
	}
	t.Fatal("no migration 10")
	return migrationFile{}
}

// watchFunctionsNotify reports whether any watch's own trigger function
// (outbox_watch_<16 hex>) in schema calls outbox_notify(), whether the
// generic outbox_watch() there does, and how many own functions there are.
func watchFunctionsNotify(t *testing.T, pool *pgxpool.Pool, schema string) (own, generic bool, ownFunctions int) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT
		coalesce(bool_or(p.prosrc ~ 'outbox_notify\(\)') FILTER (WHERE p.proname ~ '^outbox_watch_[0-9a-f]{16}$'), false),
		coalesce(bool_or(p.prosrc ~ 'outbox_notify\(\)') FILTER (WHERE p.proname = 'outbox_watch'), false),
		count(*) FILTER (WHERE p.proname ~ '^outbox_watch_[0-9a-f]{16}$')
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE p.proname LIKE 'outbox_watch%' AND n.nspname = $1`, schema).Scan(&own, &generic, &ownFunctions))
	return own, generic, ownFunctions
}

// Migration 010's DO block writes its regular expressions as ordinary
// string literals with backslashes ('…outbox_notify\(\);'). A session with
// standard_conforming_strings off (a legacy database or role setting, or a
// migration tool's session) reads '\(' as '(', so the expressions match
// nothing, and the up migration "succeeds" while every watch's own function
// keeps notifying. (Dollar-quoted or E-prefixed literals read the same either way;
// the library's Literal already guards against this setting.)
func TestMigration10QuietsOwnFunctionsWithStandardConformingStringsOff(t *testing.T) {
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
func TestMigration10InAMixedCaseSchema(t *testing.T) {
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
func TestMigration10SkipsAnotherRolesWatchFunction(t *testing.T) {
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
	migrator, stranger := newRole(t, pool, "migrator"), newRole(t, pool, "stranger")
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

// A host role with the privileges 0.1.0 needed for the SQL write paths
// (INSERT and SELECT on outbox_events, SELECT and UPDATE on outbox_settings)
// keeps writing after Migrate: the migration must not make the host's own
// transactions fail. Migration 004's throttle reads and sets the sequence
// outbox_notify_slot inside the host's transaction, as the host's role, and
// nothing grants that role the sequence: every outbox_record() and every
// write to a watched table fails with "permission denied for sequence".
func TestLeastPrivilegedHostRoleKeepsWritingAfterMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.EmptyURL(t)
	pool := testdb.Pool(t, url)
	require.NoError(t, migrate(ctx, pool, outbox, previousRelease))

	ident := newRole(t, pool, "host_app")
	exec(t, pool, "GRANT INSERT, SELECT ON outbox_events TO "+ident)
	exec(t, pool, "GRANT SELECT, UPDATE ON outbox_settings TO "+ident)
	exec(t, pool, "CREATE TABLE orders (id int PRIMARY KEY, note text NOT NULL DEFAULT '')")
	exec(t, pool, "GRANT SELECT, INSERT, UPDATE ON orders TO "+ident)

	asHost := func(f func(tx pgx.Tx) error) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+ident); err != nil {
				return err
			}
			return f(tx)
		})
	}
	sqlRecord := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT outbox_record('order.placed', 'order:1')")
		return err
	}
	require.NoError(t, asHost(sqlRecord), "the previous release: the host role records from SQL")

	require.NoError(t, outbox.Migrate(ctx, pool))
	require.NoError(t, outbox.InstallWatch(ctx, pool, Watch{Table: "orders", Types: map[Op]string{OpInsert: "order.created"}}))

	require.NoError(t, asHost(sqlRecord), "after Migrate: outbox_record() as the host role")
	require.NoError(t, asHost(func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO orders (id) VALUES (1)")
		return err
	}), "after Migrate: a write to a watched table as the host role")
	require.NoError(t, asHost(func(tx pgx.Tx) error {
		_, err := Record(ctx, tx, Event{Type: "order.placed"})
		return err
	}), "after Migrate: Record as the host role")

	// Under SERIALIZABLE events are noted in a temporary table (migration
	// 014): with the TEMPORARY privilege PUBLIC has by default, and without
	// it (nothing noted: RecordedInTx reads the outbox).
	serializable := func(f func(tx pgx.Tx) error) error {
		return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+ident); err != nil {
				return err
			}
			return f(tx)
		})
	}
	recordAndList := func(tx pgx.Tx) error {
		if _, err := Record(ctx, tx, Event{Type: "order.placed"}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO orders (id) VALUES ((SELECT max(id) + 1 FROM orders))"); err != nil {
			return err
		}
		made, err := RecordedInTx(ctx, tx)
		if err == nil && len(made) != 2 {
			err = fmt.Errorf("RecordedInTx returned %d events, want 2", len(made))
		}
		return err
	}
	require.NoError(t, serializable(recordAndList), "SERIALIZABLE, as the host role")
	var db string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_database()").Scan(&db))
	exec(t, pool, "REVOKE TEMPORARY ON DATABASE "+pgx.Identifier{db}.Sanitize()+" FROM PUBLIC")
	pool.Reset() // sessions that made the temporary table already
	require.NoError(t, serializable(recordAndList), "SERIALIZABLE, as a host role that may not make temporary tables")
}

// Migration 006 carries 0.1.0's catch_up lists over into owed pairs, and a
// catch-up that 0.1.0 poisoned into a poisoned pair of an event no longer
// poisoned as a whole.
func TestMigrationCarriesCatchUpListsOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.EmptyURL(t))
	require.NoError(t, migrate(ctx, pool, outbox, 4))
	exec(t, pool, `INSERT INTO outbox_subscribers (name) VALUES ('x'), ('y'), ('old')`)
	exec(t, pool, `UPDATE outbox_subscribers SET retired_at = now() WHERE name = 'old'`)
	exec(t, pool, `INSERT INTO outbox_events (id, type, fanned_out_at, fanout, catch_up) VALUES
		('0194f1c6-7d6a-7000-8000-000000000001', 'a', now(), '{"x": 1}', ARRAY['y', 'old']),
		('0194f1c6-7d6a-7000-8000-000000000002', 'a', now(), '{"x": 2}', NULL)`)
	exec(t, pool, `INSERT INTO outbox_events (id, type, fanned_out_at, fanout, catch_up, attempts, last_error, poisoned_at) VALUES
		('0194f1c6-7d6a-7000-8000-000000000003', 'a', now(), '{"x": 3}', ARRAY['y'], 5, 'y failed', now())`)
	require.NoError(t, outbox.Migrate(ctx, pool))
	pairs := loadPairs(t, pool)
	require.Len(t, pairs, 2)
	require.Equal(t, pairRow{}, pairs[uuid.MustParse("0194f1c6-7d6a-7000-8000-000000000001")]["y"])
	require.Equal(t, pairRow{Attempts: 5, LastError: "y failed", Errors: 1, Poisoned: true},
		pairs[uuid.MustParse("0194f1c6-7d6a-7000-8000-000000000003")]["y"])
	rows := loadRows(t, pool)
	for _, r := range rows {
		require.False(t, r.Poisoned, "event %s is fanned out: only its pair is poisoned", r.ID)
	}
	var lists int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE catch_up IS NOT NULL").Scan(&lists))
	require.Zero(t, lists)
}

// Every statement of the query layer prepares on a migrated database — the
// tables, columns, functions and types it names exist as it names them —
// in the search_path's schema and in a named one. In the named schema the
// search_path holds none of the library's or River's tables, so a name the
// layer failed to qualify does not prepare either.
func TestEveryStatementPreparesInTheSearchPathAndInANamedSchema(t *testing.T) {
	t.Parallel()
	for _, schema := range []string{"", "tenant_q"} {
		t.Run("schema="+schema, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t, testdb.EmptyURL(t))
			require.NoError(t, Outbox{Schema: schema}.Migrate(ctx, pool))
			set, err := statements.For(schema)
			require.NoError(t, err)
			conn, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			prepared := 0
			var walk func(v reflect.Value)
			walk = func(v reflect.Value) {
				for i := range v.NumField() {
					f := v.Type().Field(i)
					switch {
					case f.Tag.Get("sql") == "-":
					case f.Type.Kind() == reflect.Struct:
						walk(v.Field(i))
					case strings.Contains(v.Field(i).String(), "TEMPLATE"):
						// Call-time DDL (watch triggers, CREATE SCHEMA): the
						// watch and migrate tests run it.
					default:
						_, err := conn.Conn().Prepare(ctx, "layer_"+f.Name, v.Field(i).String())
						require.NoError(t, err, "%s does not prepare in schema %q", f.Name, schema)
						prepared++
					}
				}
			}
			walk(reflect.ValueOf(set).Elem())
			require.Greater(t, prepared, 90)
		})
	}
}

// previousRelease is the library's schema version of the last release
// (0.1.0): upgrades start from it.
const previousRelease = 3

// The previous release's binaries keep working on the migrated schema, so a
// deploy can migrate first and roll out after: every statement 0.1.0 sends
// (kept in testdata, as that release built them) still prepares — its
// tables, columns and functions all exist with the types it expects — and
// its write path still records.
func TestPreviousReleaseStatementsWorkOnTheMigratedSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	raw, err := os.ReadFile("testdata/v0.1.0_statements.json")
	require.NoError(t, err)
	var stmts map[string]string
	require.NoError(t, json.Unmarshal(raw, &stmts))
	names := make([]string, 0, len(stmts))
	for name := range stmts {
		names = append(names, name)
	}
	sort.Strings(names)
	conn, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	prepared := 0
	for _, name := range names {
		if slices.Contains([]string{"Schema", "ChannelEvents", "ChannelFanned", "WatchFunction"}, name) {
			continue
		}
		_, err := conn.Conn().Prepare(ctx, "v010_"+strings.ReplaceAll(name, ".", "_"), stmts[name])
		require.NoError(t, err, "0.1.0's %s no longer prepares on the migrated schema", name)
		prepared++
	}
	require.Greater(t, prepared, 30)
	// And 0.1.0's Record, run as it ran it.
	var seq int64
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, stmts["RecordNotify"], "0194f1c6-7d6a-7000-8000-000000000001", "old.release", "", "{}", nil, "").Scan(&seq, new(time.Time))
	}))
	require.Positive(t, seq)
}

// Migrate from the previous release runs while writers record: on a table of
// a million rows, with 16 writers, no Record waits on the migration for more
// than an instant. (0.1.0's own migration held the table's lock while it
// built an index: writers stalled for a second and more.)
func TestMigrateFromThePreviousReleaseWhileWritersRecord(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("loads a million rows: run without -short (CI does)")
	}
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.EmptyURL(t))
	require.NoError(t, migrate(ctx, pool, outbox, previousRelease))
	exec(t, pool, `INSERT INTO outbox_events (id, type, fanned_out_at, fanout, created_at)
		SELECT gen_random_uuid(), 'bulk', now() - g * interval '1 second', '{}', now() - interval '1 day'
		  FROM generate_series(1, 1000000) g`)
	exec(t, pool, "ANALYZE outbox_events")

	var (
		mu                 sync.Mutex
		before, during     time.Duration // longest Record + commit, before and while Migrate runs
		migrating, stopped = make(chan struct{}), make(chan struct{})
		wg                 sync.WaitGroup
		recorded           int
	)
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-stopped:
					return
				default:
				}
				inMigration := false
				select {
				case <-migrating:
					inMigration = true
				default:
				}
				start := time.Now()
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					// 0.1.0's columns only: the writer is the previous
					// release, still running while the schema moves on.
					_, err := tx.Exec(ctx, "INSERT INTO outbox_events (id, type) VALUES (gen_random_uuid(), 'during.migration')")
					return err
				})
				took := time.Since(start)
				mu.Lock()
				recorded++
				if inMigration {
					during = max(during, took)
				} else {
					before = max(before, took)
				}
				mu.Unlock()
				if err != nil {
					t.Errorf("a writer failed during the migration: %v", err)
					return
				}
			}
		})
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return recorded }
	// A stretch of writes before, as the baseline.
	require.Eventually(t, func() bool { return count() >= 500 }, 30*time.Second, time.Millisecond)
	close(migrating)
	start := time.Now()
	require.NoError(t, outbox.Migrate(ctx, pool))
	took := time.Since(start)
	// And writes right after it.
	after := count()
	require.Eventually(t, func() bool { return count() >= after+200 }, 30*time.Second, time.Millisecond)
	close(stopped)
	wg.Wait()
	var version int
	require.NoError(t, pool.QueryRow(ctx, "SELECT max(version) FROM outbox_migration").Scan(&version))
	files, err := loadMigrations()
	require.NoError(t, err)
	require.Equal(t, files[len(files)-1].version, version)
	t.Logf("Migrate from %d took %v; %d transactions; longest write before %v, during and after %v",
		previousRelease, took, recorded, before, during)
	require.Less(t, during, max(500*time.Millisecond, 3*before),
		"a writer stalled behind the migration")
}

// The claim floor's index (version 17) is built concurrently: while a
// writer's transaction is open, the build waits for it without taking a lock
// that queues the other writers (a plain CREATE INDEX asks for SHARE, and
// every Record waits behind it), and Migrate completes once it is gone.
func TestMigrateBuildsAnIndexWithoutQueueingWriters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.EmptyURL(t))
	require.NoError(t, migrate(ctx, pool, outbox, 16))

	open, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = open.Rollback(ctx) }()
	_, err = Record(ctx, open, Event{Type: "open.writer"})
	require.NoError(t, err)

	migrated := make(chan error, 1)
	go func() { migrated <- outbox.Migrate(ctx, pool) }()
	// The build waits for the open writer.
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'CREATE INDEX CONCURRENTLY%' AND wait_event_type = 'Lock')`).Scan(&waiting))
		return waiting
	}, 30*time.Second, 10*time.Millisecond, "the index build never waited for the open writer")
	var share int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks
		WHERE relation = to_regclass('outbox_events') AND mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')`).Scan(&share))
	require.Zero(t, share, "the migration holds or asks for a lock that queues writers")
	// Other writers go on meanwhile.
	require.NoError(t, pgx.BeginFunc(within(t, 30*time.Second), pool, func(tx pgx.Tx) error {
		_, err := Record(ctx, tx, Event{Type: "while.building"})
		return err
	}))
	select {
	case err := <-migrated:
		t.Fatalf("Migrate returned while the writer it waits for was open: %v", err)
	default:
	}

	require.NoError(t, open.Commit(ctx))
	select {
	case err := <-migrated:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Migrate never finished after the writer committed")
	}
	var valid bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_events_claim_floor_idx'::regclass").Scan(&valid))
	require.True(t, valid)
}

// A concurrent build cut short (its caller gave up while it waited) leaves
// an invalid index behind, which CREATE INDEX IF NOT EXISTS would take for
// done: Migrate drops it and builds it again, in the default schema and in
// a named one.
func TestMigrateRebuildsAnIndexWhoseBuildWasCutShort(t *testing.T) {
	t.Parallel()
	for _, o := range []Outbox{{}, {Schema: "cut_short"}} {
		t.Run(cmp.Or(o.Schema, "search_path"), func(t *testing.T) {
			ctx := context.Background()
			pool := testdb.Pool(t, testdb.EmptyURL(t))
			require.NoError(t, migrate(ctx, pool, o, 16))
			table := "outbox_events"
			if o.Schema != "" {
				table = pgx.Identifier{o.Schema, "outbox_events"}.Sanitize()
			}
			files, err := loadMigrations()
			require.NoError(t, err)
			i := slices.IndexFunc(files, func(f migrationFile) bool { return f.version == 17 })
			_, create, err := concurrentIndex(o.Schema, files[i].up)
			require.NoError(t, err)

			// Cut short: the build waits for an open writer, and its
			// caller gives up.
			open, err := pool.Begin(ctx)
			require.NoError(t, err)
			_, err = open.Exec(ctx, "INSERT INTO "+table+" (id, type) VALUES (gen_random_uuid(), 'open')")
			require.NoError(t, err)
			built := make(chan error, 1)
			go func() { _, err := pool.Exec(ctx, create); built <- err }()
			var pid int
			require.Eventually(t, func() bool {
				err := pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
					WHERE datname = current_database() AND query LIKE 'CREATE INDEX CONCURRENTLY%' AND wait_event_type = 'Lock'`).Scan(&pid)
				return err == nil
			}, 30*time.Second, 10*time.Millisecond, "the build never waited for the open writer")
			exec(t, pool, "SELECT pg_cancel_backend($1)", pid)
			require.Error(t, <-built)
			require.NoError(t, open.Rollback(ctx))
			valid := func() bool {
				var v bool
				require.NoError(t, pool.QueryRow(ctx, `SELECT indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
					WHERE c.relname = 'outbox_events_claim_floor_idx'`).Scan(&v))
				return v
			}
			require.False(t, valid(), "the cut-short build left no invalid index")

			require.NoError(t, migrate(ctx, pool, o, 18)) // 020 drops the empty table's index
			require.True(t, valid(), "Migrate left the invalid index")
		})
	}
}

// Four deploys migrate at once (TestMigrateConcurrentlyAndTwice): one
// looks, finds 017's index missing and its version not applied, and before
// its CREATE INDEX CONCURRENTLY runs, another builds the index, records 017
// and goes on past 020, which partitions the table. The late build fails
// ("cannot create index on partitioned table concurrently"); the version it
// was building is done, and Migrate says so instead of failing.
func TestMigrateFindsAnIndexVersionAnotherProcessFinishedUnderIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.EmptyURL(t))
	require.NoError(t, migrate(ctx, pool, outbox, 16))
	sql, err := statementsFor(outbox.Schema)
	require.NoError(t, err)
	step, err := migrationTx(ctx, pool, sql)
	require.NoError(t, err)
	files, err := loadMigrations()
	require.NoError(t, err)
	i := slices.IndexFunc(files, func(f migrationFile) bool { return f.version == 17 })
	require.True(t, files[i].outsideTx)

	// The second look is the one just before the build: the other process
	// migrates everything once it is done.
	looks := 0
	racing := func(f func(pgx.Tx) error) error {
		err := step(f)
		if looks++; looks == 2 {
			require.NoError(t, outbox.Migrate(ctx, pool))
		}
		return err
	}
	require.NoError(t, migrateOutsideTx(ctx, pool, sql, racing, files[i]))
	require.GreaterOrEqual(t, looks, 3, "the race was not staged: the build never ran after the other process")
	var partitioned bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT relkind = 'p' FROM pg_class WHERE oid = 'outbox_events'::regclass").Scan(&partitioned))
	require.True(t, partitioned)
	require.NoError(t, outbox.Migrate(ctx, pool))
}

// Two deploys migrate at once, each logging in as a user of its own and
// acting as the schema's owner (SET ROLE), as migration tooling commonly
// does. The second asks IndexState whether the index is being built, but
// pg_stat_progress_create_index shows the columns of another user's build
// (index_relid among them) only to a superuser or a pg_read_all_stats
// member: it sees an invalid index "that nobody builds" and issues DROP INDEX
// CONCURRENTLY under the first one's build, which it then waits for, drops,
// and builds again — or deadlocks with (the build waits for the drop's
// snapshot, the drop for the build's lock).
func TestMigrateLeavesAnIndexAnotherUserIsBuildingAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.EmptyURL(t)
	admin := testdb.Pool(t, url)
	suffix := fmt.Sprintf("%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	owner, userA, userB := "events_owner_"+suffix, "events_deploy_a_"+suffix, "events_deploy_b_"+suffix
	var dbname string
	require.NoError(t, admin.QueryRow(ctx, "SELECT current_database()").Scan(&dbname))
	for _, s := range []string{
		"CREATE ROLE " + owner + " NOLOGIN",
		"CREATE ROLE " + userA + " LOGIN IN ROLE " + owner,
		"CREATE ROLE " + userB + " LOGIN IN ROLE " + owner,
		"GRANT ALL ON DATABASE " + pgx.Identifier{dbname}.Sanitize() + " TO " + owner,
		"GRANT ALL ON SCHEMA public TO " + owner,
	} {
		exec(t, admin, s)
	}
	rolePool := func(user string) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(url)
		require.NoError(t, err)
		cfg.ConnConfig.User = user
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, "SET ROLE "+owner)
			return err
		}
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	poolA, poolB := rolePool(userA), rolePool(userB)
	require.NoError(t, migrate(ctx, poolA, outbox, 16))

	// A's build waits for an open writer.
	open, err := admin.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = open.Rollback(ctx) }()
	_, err = Record(ctx, open, Event{Type: "open.writer"})
	require.NoError(t, err)
	migratedA := make(chan error, 1)
	go func() { migratedA <- outbox.Migrate(ctx, poolA) }()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'CREATE INDEX CONCURRENTLY%' AND wait_event_type = 'Lock')`).Scan(&waiting))
		return waiting
	}, 30*time.Second, 10*time.Millisecond, "A's index build never waited for the open writer")

	// B migrates meanwhile: it must wait for A's build, not drop it.
	migratedB := make(chan error, 1)
	go func() { migratedB <- outbox.Migrate(ctx, poolB) }()
	dropped := false
	for deadline := time.Now().Add(5 * time.Second); !dropped && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		require.NoError(t, admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND usename = $1 AND query LIKE 'DROP INDEX CONCURRENTLY%')`, userB).Scan(&dropped))
	}
	require.NoError(t, open.Commit(ctx))
	var errA, errB error
	for _, c := range []struct {
		ch  chan error
		err *error
	}{{migratedA, &errA}, {migratedB, &errB}} {
		select {
		case *c.err = <-c.ch:
		case <-time.After(time.Minute):
			*c.err = fmt.Errorf("still migrating after a minute")
		}
	}
	t.Logf("A: %v; B: %v", errA, errB)
	require.False(t, dropped, "B dropped the index that A was building (it cannot see another user's build in pg_stat_progress_create_index)")
	require.NoError(t, errA)
	require.NoError(t, errB)
	var valid bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_events_claim_floor_idx'::regclass").Scan(&valid))
	require.True(t, valid)
}

// An invalid index left by a build cut short is dropped and built again
// even while autovacuum works on the outbox: autovacuum holds the table's
// SHARE UPDATE EXCLUSIVE lock, as a build does, and Migrate took it for
// another process's build and waited it out — for as long as the vacuum of
// a large outbox lasts. A DROP INDEX CONCURRENTLY queued behind it cancels
// it instead (as PostgreSQL cancels an autovacuum that blocks a lock). The
// vacuum here crawls (a cost delay of 100 ms a page): it would last minutes.
func TestMigrateDoesNotWaitOutAnAutovacuumOfTheOutbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, floorURL(t))
	// Version 18's schema, of its own: 020 makes outbox_events a
	// partitioned table, which version 17's index is not built on.
	o := Outbox{Schema: "before_ring"}
	require.NoError(t, migrate(ctx, pool, o, 18))
	exec(t, pool, "ALTER SYSTEM SET autovacuum_naptime = '1s'")
	exec(t, pool, "SELECT pg_reload_conf()")
	exec(t, pool, `ALTER TABLE before_ring.outbox_events SET (autovacuum_vacuum_threshold = 0, autovacuum_vacuum_scale_factor = 0,
		autovacuum_vacuum_cost_delay = 100, autovacuum_vacuum_cost_limit = 1)`)
	// What a build cut short leaves: the index, invalid, and no version 17.
	exec(t, pool, "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'before_ring.outbox_events_claim_floor_idx'::regclass")
	exec(t, pool, "DELETE FROM before_ring.outbox_migration WHERE version = 17")
	exec(t, pool, "INSERT INTO before_ring.outbox_events (id, type, fanned_out_at) SELECT gen_random_uuid(), 'dead', now() FROM generate_series(1, 20000)")
	exec(t, pool, "DELETE FROM before_ring.outbox_events")
	require.Eventually(t, func() bool {
		var vacuuming bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_progress_vacuum
			WHERE relid = 'before_ring.outbox_events'::regclass)`).Scan(&vacuuming))
		return vacuuming
	}, 60*time.Second, 50*time.Millisecond, "autovacuum never started on outbox_events")

	began := time.Now()
	migrateCtx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	require.NoError(t, migrate(migrateCtx, pool, o, 18), "Migrate waited out the autovacuum (%v)", time.Since(began))
	t.Logf("migrated in %v", time.Since(began))
	var valid bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT indisvalid FROM pg_index WHERE indexrelid = 'before_ring.outbox_events_claim_floor_idx'::regclass").Scan(&valid))
	require.True(t, valid)
}

// Migration 020 makes the existing outbox a partition of the ring, rows and
// all, without a copy: every row is still there (in outbox_events_legacy),
// seq carries on from the identity's value, a transaction that had
// recorded before the migration and commits after it has its event fanned
// out, and retention empties the old table whole once its rows expire.
func TestMigrationToThePartitionRingKeepsTheTableAndItsRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.EmptyURL(t)
	pool := testdb.Pool(t, url)
	require.NoError(t, migrate(ctx, pool, outbox, 18))
	exec(t, pool, `INSERT INTO outbox_events (id, type, fanned_out_at, fanout)
		SELECT gen_random_uuid(), 'old', now() - interval '2 hours', '{}' FROM generate_series(1, 1000)`)
	var pending []uuid.UUID
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		es, err := RecordMany(ctx, tx, []Event{{Type: "before.a"}, {Type: "before.b"}})
		for _, e := range es {
			pending = append(pending, e.ID)
		}
		return err
	}))
	var lastSeq int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT max(seq) FROM outbox_events").Scan(&lastSeq))

	// A transaction that recorded before the migration: the swap's lock
	// waits for it (Migrate retries), and its event is there afterwards.
	open, err := pool.Begin(ctx)
	require.NoError(t, err)
	straddling, err := Record(ctx, open, Event{Type: "straddling"})
	require.NoError(t, err)
	migrated := make(chan error, 1)
	go func() { migrated <- outbox.Migrate(ctx, pool) }()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting))
		return waiting
	}, 30*time.Second, 10*time.Millisecond, "the migration never waited for the open writer")
	require.NoError(t, open.Commit(ctx))
	select {
	case err := <-migrated:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Migrate never finished after the writer committed")
	}

	var partitioned bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT relkind = 'p' FROM pg_class WHERE oid = 'outbox_events'::regclass").Scan(&partitioned))
	require.True(t, partitioned)
	var legacy, all int
	require.NoError(t, pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM outbox_events_legacy), (SELECT count(*) FROM outbox_events)").Scan(&legacy, &all))
	require.Equal(t, 1003, legacy)
	require.Equal(t, 1003, all)
	after := setup(t, setupOpts{url: url}, mapSub("audit", false, "**"))
	next := after.record(t, Event{Type: "after"})[0]
	require.Greater(t, next.Seq, lastSeq, "seq went back")
	after.start(t)
	waitFannedOut(t, pool, 30*time.Second)
	jobs := loadJobs(t, pool)
	for _, id := range append(pending, straddling.ID, next.ID) {
		n := 0
		for _, j := range jobs {
			if j.EventID == id {
				n++
			}
		}
		require.Equal(t, 1, n, "jobs of %s", id)
	}

	// Once its rows expire, the old table is emptied whole (its lock is
	// taken NOWAIT: the running relay's rounds may hold it a moment).
	sql := defaultSQL(t)
	var emptied bool
	require.Eventually(t, func() bool {
		err := pool.QueryRow(ctx, sql.TruncateExpired, "outbox_events_legacy", int64(1)).Scan(&emptied)
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == pgerrcode.LockNotAvailable {
			return false
		}
		require.NoError(t, err)
		return true
	}, 30*time.Second, 10*time.Millisecond, "the old table was never free to lock")
	require.True(t, emptied)
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events").Scan(&all))
	require.Equal(t, 1, all, "only the event recorded after the migration is left")
}

// Migration 020 drops the outbox table if it is empty once locked. Under a
// database whose default isolation is REPEATABLE READ, a snapshot taken
// before the lock wait would not see an event committed during it, and
// drop it with the table: Migrate's transactions are READ COMMITTED.
func TestMigrationToThePartitionRingSeesWhatCommittedWhileItWaited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.EmptyURL(t)
	pool := testdb.Pool(t, url)
	require.NoError(t, migrate(ctx, pool, outbox, 19))
	var db string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_database()").Scan(&db))
	exec(t, pool, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET default_transaction_isolation = 'repeatable read'")
	migrator := testdb.Pool(t, url) // new connections: REPEATABLE READ by default

	host, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = host.Rollback(ctx) }()
	e, err := Record(ctx, host, Event{Type: "committed.during.the.swap"})
	require.NoError(t, err)

	migrated := make(chan error, 1)
	go func() { migrated <- outbox.Migrate(ctx, migrator) }()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%step 2 of 2%')`).Scan(&waiting))
		return waiting
	}, 30*time.Second, 2*time.Millisecond, "the migration never waited for the open writer")
	require.NoError(t, host.Commit(ctx))
	select {
	case err := <-migrated:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Migrate never finished")
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE id = $1", e.ID).Scan(&n))
	require.Equal(t, 1, n, "the committed event %s was dropped with outbox_events_legacy", e.ID)
}

// Migration 020 run by another role than the outbox table's owner (a DBA, a
// superuser running `events migrate`): the new table and its partitions
// belong to the old table's owner, which the service records as.
func TestMigrationToThePartitionRingKeepsTheTablesOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.EmptyURL(t)
	pool := testdb.Pool(t, url)
	require.NoError(t, migrate(ctx, pool, outbox, 18))
	role := newRole(t, pool, "app_owner")
	exec(t, pool, "ALTER TABLE outbox_events OWNER TO "+role)
	exec(t, pool, "GRANT SELECT, UPDATE ON outbox_settings TO "+role)
	exec(t, pool, "INSERT INTO outbox_events (id, type) VALUES (gen_random_uuid(), 'kept')") // a non-empty table: attached
	asOwner := func() error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+role); err != nil {
				return err
			}
			_, err := Record(ctx, tx, Event{Type: "order.placed"})
			return err
		})
	}
	require.NoError(t, asOwner(), "before 020, the owner records")
	require.NoError(t, outbox.Migrate(ctx, pool)) // as another role
	require.NoError(t, asOwner(), "after 020, the former owner of outbox_events cannot record")
}
