package events

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/statements"
	"github.com/standmeet/events/internal/testdb"
)

// A watch's own trigger function records exactly what the generic
// outbox_watch() records with the same arguments: for every payload mode and
// operation, with a subject and a scope column of types whose JSON text is
// not their SQL text, NULLs, quotes and backslashes.
func TestWatchOwnFunctionRecordsWhatTheGenericOneDoes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	sql, err := statements.For("")
	require.NoError(t, err)
	for _, mode := range []PayloadMode{PayloadNone, PayloadRow, PayloadOldNew, PayloadColumns} {
		for _, table := range []string{"own_" + string(mode), "gen_" + string(mode)} {
			exec(t, pool, fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY, "Seen At" timestamptz, tenant text,
				"odd$own$col" text, n numeric)`, table))
		}
		w := Watch{Table: "own_" + string(mode), Types: map[Op]string{OpInsert: "t.ins", OpUpdate: "t.upd", OpDelete: "t.del"},
			SubjectPrefix: `it's\`, SubjectColumn: "Seen At", Payload: mode, ScopePrefix: "s:", ScopeColumn: "tenant"}
		if mode == PayloadColumns {
			w.PayloadColumns = []string{"n", "odd$own$col", "Seen At"}
		}
		require.NoError(t, outbox.InstallWatch(ctx, pool, w))
		// The generic triggers, with the same arguments, on the twin table.
		w.Table = "gen_" + string(mode)
		ddls, err := w.triggerDDL(sql, `"public".`+pgx.Identifier{w.Table}.Sanitize(), "Seen At")
		require.NoError(t, err)
		for _, ddl := range ddls {
			require.Contains(t, ddl, "EXECUTE FUNCTION outbox_watch(")
			exec(t, pool, ddl)
		}
		for _, table := range []string{"own_" + string(mode), "gen_" + string(mode)} {
			exec(t, pool, fmt.Sprintf(`INSERT INTO %s VALUES (1, '2026-12-01 10:00:00.5+02', 'a''b', 'x\y', 1.50),
				(2, NULL, NULL, NULL, NULL)`, table))
			exec(t, pool, fmt.Sprintf(`UPDATE %s SET n = 2, tenant = 'c' WHERE id = 1`, table))
			exec(t, pool, fmt.Sprintf(`DELETE FROM %s WHERE id = 2`, table))
		}
	}
	var own, gen []string
	rows, err := pool.Query(ctx, `SELECT type || ' ' || subject || ' ' || payload::text || ' ' || scope FROM outbox_events ORDER BY seq`)
	require.NoError(t, err)
	all, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	// Per mode: 4 rows from the own table, then 4 from the generic twin.
	require.Len(t, all, 4*8)
	for m := range 4 {
		own = append(own, all[m*8:m*8+4]...)
		gen = append(gen, all[m*8+4:m*8+8]...)
	}
	require.Equal(t, gen, own)
	require.Contains(t, strings.Join(own, "\n"), `it's\2026-12-01T08:00:00.5+00:00`, "the subject is the column's JSON text")

	var callers int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
		WHERE p.proname LIKE 'outbox\_watch\_%' AND t.tgrelid::regclass::text LIKE 'own\_%'`).Scan(&callers))
	require.Equal(t, 12, callers, "every trigger of the own tables calls a function of its own")
}

// Triggers keep the generic definition's arguments and fingerprint, so an
// older release reads the spec back (ListWatches) and leaves the trigger
// alone (InstallWatch compares fingerprints); installing again changes
// nothing; removing the watch drops its functions.
func TestWatchOwnFunctionsKeepTheGenericFingerprintAndGoWithTheWatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	createNotes(t, pool, 2)
	w := Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed", OpDelete: "note.deleted"}, SubjectPrefix: "note:"}
	require.NoError(t, outbox.InstallWatch(ctx, pool, w))

	sql, err := statements.For("")
	require.NoError(t, err)
	w.Name, w.Payload = "events", PayloadNone
	ddls, err := w.triggerDDL(sql, `"public"."corpus_notes"`, "id")
	require.NoError(t, err)
	functions := func() map[string]string {
		rows, err := pool.Query(ctx, `SELECT t.tgname::text, p.proname::text || ' ' || coalesce(obj_description(t.oid, 'pg_trigger'), '')
			FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid WHERE t.tgrelid = 'corpus_notes'::regclass`)
		require.NoError(t, err)
		out := map[string]string{}
		var name, v string
		_, err = pgx.ForEachRow(rows, []any{&name, &v}, func() error { out[name] = v; return nil })
		require.NoError(t, err)
		return out
	}
	want := map[string]string{}
	for name, ddl := range ddls {
		want[name] = watchFunctionName(ddl) + " " + watchFingerprint(ddls)
	}
	require.Equal(t, want, functions())

	listed, err := outbox.ListWatches(ctx, pool)
	require.NoError(t, err)
	require.Len(t, listed, 1)
	require.Equal(t, map[Op]string{OpUpdate: "note.changed", OpDelete: "note.deleted"}, listed[0].Types)

	var oid1, oid2 uint32
	require.NoError(t, pool.QueryRow(ctx, `SELECT oid FROM pg_trigger WHERE tgname = 'outbox_watch_events_update'`).Scan(&oid1))
	require.NoError(t, outbox.InstallWatch(ctx, pool, w))
	require.NoError(t, pool.QueryRow(ctx, `SELECT oid FROM pg_trigger WHERE tgname = 'outbox_watch_events_update'`).Scan(&oid2))
	require.Equal(t, oid1, oid2, "an unchanged watch was installed again")

	require.NoError(t, outbox.RemoveWatch(ctx, pool, "", "corpus_notes", ""))
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE proname LIKE 'outbox\_watch\_%'`).Scan(&left))
	require.Zero(t, left, "RemoveWatch left its trigger functions")
}

// A role that may not create functions in the outbox's schema gets the
// generic trigger function, and installing again leaves it alone.
func TestWatchWithoutCreateOnTheSchemaUsesTheGenericFunction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	createNotes(t, pool, 1)
	const role = "watch_installer_without_create" // roles are the cluster's: this test's alone
	exec(t, pool, fmt.Sprintf(`DO $$ BEGIN
		IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '%[1]s') THEN CREATE ROLE %[1]s; END IF; END $$`, role))
	exec(t, pool, "ALTER TABLE corpus_notes OWNER TO "+role)
	exec(t, pool, "REVOKE CREATE ON SCHEMA public FROM PUBLIC")
	exec(t, pool, "REVOKE CREATE ON SCHEMA public FROM "+role)
	w := Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed"}, SubjectPrefix: "note:"}
	install := func() {
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+role); err != nil {
				return err
			}
			return outbox.InstallWatch(ctx, tx, w)
		}))
	}
	install()
	var fn string
	var oid1, oid2 uint32
	require.NoError(t, pool.QueryRow(ctx, `SELECT p.proname, t.oid FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
		WHERE t.tgname = 'outbox_watch_events_update'`).Scan(&fn, &oid1))
	require.Equal(t, "outbox_watch", fn)
	install()
	require.NoError(t, pool.QueryRow(ctx, `SELECT t.oid FROM pg_trigger t WHERE t.tgname = 'outbox_watch_events_update'`).Scan(&oid2))
	require.Equal(t, oid1, oid2, "the generic trigger was replaced again")
	exec(t, pool, "UPDATE corpus_notes SET title = 'x'")
	require.Len(t, eventsOfType(t, pool, "note.changed"), 1)
}

// A watch the previous release installed (the generic function, the same
// fingerprint) is moved to functions of its own by the next InstallWatch,
// but never by queueing the table's writers behind a long transaction: if
// the table's lock does not come within upgradeLockTimeout, the watch stays
// as it was and InstallWatch returns nil.
func TestWatchUpgradeToOwnFunctionsWaitsOnlyAnInstantForTheTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	createNotes(t, pool, 1)
	w := Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed"}, SubjectPrefix: "note:", Name: "events", Payload: PayloadNone}
	sql, err := statements.For("")
	require.NoError(t, err)
	ddls, err := w.triggerDDL(sql, `"public"."corpus_notes"`, "id")
	require.NoError(t, err)
	for name, ddl := range ddls { // as the previous release installed it
		exec(t, pool, ddl)
		exec(t, pool, fmt.Sprintf("COMMENT ON TRIGGER %s ON corpus_notes IS %s", name, statements.Literal(watchFingerprint(ddls))))
	}
	function := func() string {
		var fn string
		require.NoError(t, pool.QueryRow(ctx, `SELECT p.proname FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
			WHERE t.tgname = 'outbox_watch_events_update'`).Scan(&fn))
		return fn
	}

	// A long reader holds the table.
	reader, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = reader.Exec(ctx, "LOCK TABLE corpus_notes IN ACCESS SHARE MODE")
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '7s'"); err != nil {
			return err
		}
		if err := outbox.InstallWatch(ctx, tx, w); err != nil {
			return err
		}
		var lt string
		require.NoError(t, tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&lt))
		require.Equal(t, "7s", lt, "InstallWatch changed the caller's lock_timeout")
		return nil
	}))
	require.Less(t, time.Since(start), 5*time.Second, "InstallWatch waited for the table")
	require.Equal(t, "outbox_watch", function(), "the watch changed without the table's lock")
	require.NoError(t, reader.Rollback(ctx))

	require.NoError(t, outbox.InstallWatch(ctx, pool, w))
	require.Equal(t, watchFunctionName(ddls["outbox_watch_events_update"]), function())
	exec(t, pool, "UPDATE corpus_notes SET title = 'x'")
	require.Len(t, eventsOfType(t, pool, "note.changed"), 1)
}
