package events

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/statements"
	"github.com/standmeet/events/internal/testdb"
)

func createNotes(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	exec(t, pool, `CREATE TABLE corpus_notes (
			id int PRIMARY KEY, title text NOT NULL, body text NOT NULL DEFAULT '', views int NOT NULL DEFAULT 0)`)
	exec(t, pool, "INSERT INTO corpus_notes (id, title) SELECT g, 'note ' || g FROM generate_series(1, $1::int) g", n)
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	_, err := pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

func eventsOfType(t *testing.T, pool *pgxpool.Pool, typ string) []eventRow {
	t.Helper()
	var out []eventRow
	for _, r := range loadRows(t, pool) {
		if r.Type == typ {
			out = append(out, r)
		}
	}
	return out
}

func TestWatchRecordsOnlyRealChangesOfWatchedColumns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	createNotes(t, b.pool, 3)
	require.NoError(t, outbox.InstallWatch(ctx, b.pool, Watch{
		Table: "corpus_notes", Types: map[Op]string{OpUpdate: "corpus.note.changed"},
		Columns: []string{"title", "body"}, SubjectPrefix: "note:",
	}))
	exec(t, b.pool, "UPDATE corpus_notes SET title = 'renamed' WHERE id = 1")
	exec(t, b.pool, "UPDATE corpus_notes SET views = views + 1")                    // unwatched column only
	exec(t, b.pool, "UPDATE corpus_notes SET title = title, body = body")           // same values
	exec(t, b.pool, "UPDATE corpus_notes SET title = 'x', body = 'y' WHERE id = 2") // two watched columns, one row
	got := eventsOfType(t, b.pool, "corpus.note.changed")
	require.Len(t, got, 2)
	subjects := map[string]bool{}
	for _, r := range got {
		subjects[r.Subject] = true
		require.JSONEq(t, `{}`, string(r.Payload))
	}
	require.Equal(t, map[string]bool{"note:1": true, "note:2": true}, subjects)
}

func TestWatchInsertDeleteAndPayloads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	createNotes(t, b.pool, 0)
	require.NoError(t, outbox.InstallWatch(ctx, b.pool, Watch{
		Table: "corpus_notes", Name: "cols",
		Types:   map[Op]string{OpInsert: "note.created", OpDelete: "note.deleted"},
		Payload: PayloadColumns, PayloadColumns: []string{"title"}, SubjectPrefix: "note:",
	}))
	require.NoError(t, outbox.InstallWatch(ctx, b.pool, Watch{
		Table: "corpus_notes", Name: "audit", Types: map[Op]string{OpUpdate: "note.audit"},
		Payload: PayloadOldNew, SubjectColumn: "-", SubjectPrefix: "notes",
	}))
	exec(t, b.pool, "INSERT INTO corpus_notes (id, title, body) VALUES (7, 'seven', 'secret')")
	exec(t, b.pool, "UPDATE corpus_notes SET views = 1 WHERE id = 7")
	exec(t, b.pool, "DELETE FROM corpus_notes WHERE id = 7")

	created := eventsOfType(t, b.pool, "note.created")
	require.Len(t, created, 1)
	require.Equal(t, "note:7", created[0].Subject)
	require.JSONEq(t, `{"title":"seven"}`, string(created[0].Payload))
	deleted := eventsOfType(t, b.pool, "note.deleted")
	require.Len(t, deleted, 1)
	require.JSONEq(t, `{"title":"seven"}`, string(deleted[0].Payload), "DELETE reads the old row")
	audit := eventsOfType(t, b.pool, "note.audit")
	require.Len(t, audit, 1)
	require.Equal(t, "notes", audit[0].Subject)
	var p struct{ Old, New map[string]any }
	require.NoError(t, json.Unmarshal(audit[0].Payload, &p))
	require.EqualValues(t, 0, p.Old["views"])
	require.EqualValues(t, 1, p.New["views"])

	// PayloadRow: the whole row.
	require.NoError(t, outbox.InstallWatch(ctx, b.pool, Watch{Table: "corpus_notes", Name: "cols",
		Types: map[Op]string{OpInsert: "note.created"}, Payload: PayloadRow}))
	exec(t, b.pool, "INSERT INTO corpus_notes (id, title) VALUES (8, 'eight')")
	var payload []byte
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT payload FROM outbox_events WHERE type = 'note.created' AND subject = '8'").Scan(&payload))
	require.JSONEq(t, `{"id":8,"title":"eight","body":"","views":0}`, string(payload))
}

func TestWatchBulkUpdateAndRollback(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	createNotes(t, b.pool, 500)
	require.NoError(t, outbox.InstallWatch(ctx, b.pool, Watch{Table: "corpus_notes",
		Types: map[Op]string{OpUpdate: "corpus.note.changed"}, Columns: []string{"title"}}))
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "UPDATE corpus_notes SET title = title || '!'")
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Empty(t, loadRows(t, b.pool), "a rolled-back write records nothing")

	exec(t, b.pool, "UPDATE corpus_notes SET title = title || '!'")
	got := eventsOfType(t, b.pool, "corpus.note.changed")
	require.Len(t, got, 500)
	subjects := map[string]bool{}
	for _, r := range got {
		subjects[r.Subject] = true
	}
	require.Len(t, subjects, 500, "one event per row, subject from the primary key")
}

// Trigger-made events are ordinary events: fanned out, coalesced, receipted.
// A 500-row update sends no notification (migration 010): the relay finds
// the rows by its re-checks, or is woken by the awaiter's kick.
func TestWatchEventsAreFannedOutEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// One batch holds the whole transaction, so coalescing spans it.
	b := setup(t, setupOpts{config: &RelayConfig{BatchSize: 1000}}, mapSub("search", true, "corpus.**"), mapSub("webhooks", false, "corpus.**"))
	createNotes(t, b.pool, 500)
	require.NoError(t, outbox.InstallWatch(ctx, b.pool, Watch{Table: "corpus_notes",
		Types: map[Op]string{OpUpdate: "corpus.note.changed"}, Columns: []string{"title"}, SubjectPrefix: "note:"}))
	var notifications atomic.Int32
	b.relay.eng.Hooks.Notified = func() { notifications.Add(1) }
	a := startAwaiter(t, b, nil)
	b.start(t)
	b.settle(t)

	var mine []Event
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "UPDATE corpus_notes SET title = 'bulk'"); err != nil {
			return err
		}
		// In a savepoint, too: still this transaction's.
		return pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			if _, err := sp.Exec(ctx, "UPDATE corpus_notes SET title = 'again' WHERE id = 1"); err != nil {
				return err
			}
			var err error
			mine, err = RecordedInTx(ctx, sp)
			return err
		})
	}))
	require.Len(t, mine, 501)
	ids := make([]uuid.UUID, len(mine))
	for i, e := range mine {
		ids[i] = e.ID
	}
	receipts, err := a.AwaitFanout(within(t, 30*time.Second), ids...)
	require.NoError(t, err)
	require.Len(t, receipts, 501)
	require.Equal(t, receipts[0].Fanout["search"], receipts[500].Fanout["search"], "note:1's two events coalesce")
	require.NotEqual(t, receipts[0].Fanout["webhooks"], receipts[500].Fanout["webhooks"])
	b.waitIdle(t)
	// The triggers send nothing: at most the awaiter's kick (sent when its
	// first look finds rows not fanned out) wakes the relay.
	require.LessOrEqual(t, notifications.Load(), int32(1), "the watch triggers notified; only the awaiter's kick may")
}

func TestRemoveAndReplaceWatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	createNotes(t, b.pool, 1)
	w := Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed", OpDelete: "note.deleted"}, Columns: []string{"title"}}
	require.NoError(t, outbox.InstallWatch(ctx, b.pool, w))
	defs := func() []string {
		rows, err := b.pool.Query(ctx, "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'corpus_notes'::regclass ORDER BY tgname")
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	first := defs()
	require.Len(t, first, 2)
	require.NoError(t, outbox.InstallWatch(ctx, b.pool, w))
	require.Equal(t, first, defs(), "installing the same spec twice yields the same triggers")

	// Another spec replaces it: updates of body now, and no delete events.
	w.Types = map[Op]string{OpUpdate: "note.changed"}
	w.Columns = []string{"body"}
	require.NoError(t, outbox.InstallWatch(ctx, b.pool, w))
	require.Len(t, defs(), 1)
	exec(t, b.pool, "UPDATE corpus_notes SET title = 'no event'")
	exec(t, b.pool, "UPDATE corpus_notes SET body = 'event'")
	require.Len(t, eventsOfType(t, b.pool, "note.changed"), 1)

	require.NoError(t, outbox.RemoveWatch(ctx, b.pool, "", "corpus_notes", ""))
	require.Empty(t, defs())
	exec(t, b.pool, "UPDATE corpus_notes SET body = 'no event now'")
	exec(t, b.pool, "DELETE FROM corpus_notes")
	require.Len(t, loadRows(t, b.pool), 1)
	require.NoError(t, outbox.RemoveWatch(ctx, b.pool, "", "corpus_notes", ""), "removing twice is fine")
}

func TestWatchQuotesOrRefusesHostileNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	evilTable := `notes"; DROP TABLE victims; --`
	evilCol := `title'); DROP TABLE victims; --`
	exec(t, b.pool, "CREATE TABLE victims (id int)")
	exec(t, b.pool, "CREATE TABLE "+pgx.Identifier{evilTable}.Sanitize()+" (id int PRIMARY KEY, "+pgx.Identifier{evilCol}.Sanitize()+" text)")
	exec(t, b.pool, "INSERT INTO "+pgx.Identifier{evilTable}.Sanitize()+" VALUES (1, 'a')")

	// Hostile but existing names are quoted and work.
	require.NoError(t, outbox.InstallWatch(ctx, b.pool, Watch{Table: evilTable,
		Types:   map[Op]string{OpUpdate: "evil.changed"},
		Columns: []string{evilCol}, SubjectPrefix: `it's \'); DROP TABLE victims; --`,
		Payload: PayloadColumns, PayloadColumns: []string{evilCol},
	}))
	exec(t, b.pool, "UPDATE "+pgx.Identifier{evilTable}.Sanitize()+" SET "+pgx.Identifier{evilCol}.Sanitize()+" = 'b'")
	got := eventsOfType(t, b.pool, "evil.changed")
	require.Len(t, got, 1)
	require.Equal(t, `it's \'); DROP TABLE victims; --1`, got[0].Subject)
	var p map[string]string
	require.NoError(t, json.Unmarshal(got[0].Payload, &p))
	require.Equal(t, "b", p[evilCol])

	// Names that do not exist are refused before any DDL runs.
	for _, w := range []Watch{
		{Table: `nope"; DROP TABLE victims; --`, Types: map[Op]string{OpInsert: "a"}},
		{Table: evilTable, TableSchema: `public"; DROP TABLE victims; --`, Types: map[Op]string{OpInsert: "a"}},
		{Table: evilTable, Types: map[Op]string{OpUpdate: "a"}, Columns: []string{`x" = 1; DROP TABLE victims; --`}},
		{Table: evilTable, Types: map[Op]string{OpInsert: "a"}, SubjectColumn: `x"; DROP TABLE victims; --`},
		{Table: evilTable, Types: map[Op]string{OpInsert: "a'; DROP TABLE victims; --"}},
		{Table: evilTable, Name: `x"; DROP`, Types: map[Op]string{OpInsert: "a"}},
		{Table: evilTable, Types: map[Op]string{"TRUNCATE; DROP TABLE victims": "a"}},
	} {
		err := outbox.InstallWatch(ctx, b.pool, w)
		require.ErrorIs(t, err, ErrInvalidWatch, "%+v", w)
	}
	var victims bool
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT to_regclass('victims') IS NOT NULL").Scan(&victims))
	require.True(t, victims)
}

func TestOutboxRecordFromSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	b.start(t)
	b.waitIdle(t)
	var id uuid.UUID
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT outbox_record('billing.invoice.paid', 'invoice:9', '{"cents": 1200}')`).Scan(&id))
	require.Eventually(t, func() bool { return loadRows(t, b.pool)[id].FannedOut }, 30*time.Second, 5*time.Millisecond,
		"fanned out through the notification outbox_record sends")
	_, err := b.pool.Exec(ctx, `SELECT outbox_record('bad type')`)
	require.ErrorContains(t, err, "invalid event type")
	require.Len(t, loadRows(t, b.pool), 1)
}

// Installing an unchanged watch touches nothing, so it is not blocked by (and
// does not block) writers of the host's table; changing it still works, in
// one transaction.
func TestInstallWatchUnchangedTakesNoLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	createNotes(t, pool, 3)
	w := Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed"}, Columns: []string{"title"}}
	require.NoError(t, outbox.InstallWatch(ctx, pool, w))

	// A writer's transaction stays open on the table.
	writer, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer writer.Rollback(ctx)
	_, err = writer.Exec(ctx, "UPDATE corpus_notes SET body = 'x' WHERE id = 1")
	require.NoError(t, err)

	quick, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	require.NoError(t, outbox.InstallWatch(quick, pool, w), "an unchanged watch must not wait for the table's lock")

	// A changed one needs the lock: it waits for the writer.
	changed := w
	changed.Types = map[Op]string{OpUpdate: "note.edited"}
	short, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel2()
	require.Error(t, outbox.InstallWatch(short, pool, changed))
	require.NoError(t, writer.Rollback(ctx))
	require.NoError(t, outbox.InstallWatch(ctx, pool, changed))
	exec(t, pool, "UPDATE corpus_notes SET title = 'new' WHERE id = 2")
	require.Len(t, eventsOfType(t, pool, "note.edited"), 1)
	require.Empty(t, eventsOfType(t, pool, "note.changed"))
}

// Events made in SQL (outbox_record, and so triggers) get version-7 UUIDs
// that sort by time, like the ones Record makes.
func TestSQLMadeEventsHaveUUIDv7(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	var ids []uuid.UUID
	for i := range 50 {
		if i%10 == 0 {
			time.Sleep(2 * time.Millisecond) // spans several milliseconds
		}
		var id uuid.UUID
		require.NoError(t, pool.QueryRow(ctx, "SELECT outbox_record('a.b')").Scan(&id))
		ids = append(ids, id)
	}
	for i, id := range ids {
		require.Equal(t, uuid.Version(7), id.Version(), "%s", id)
		require.Equal(t, uuid.RFC4122, id.Variant(), "%s", id)
		if i > 0 {
			require.Negative(t, bytes.Compare(ids[i-1][:], id[:]), "IDs made one after another must sort: %s then %s", ids[i-1], id)
		}
	}
	// The timestamp is now, to the millisecond.
	sec, nsec := ids[len(ids)-1].Time().UnixTime()
	require.WithinDuration(t, time.Now(), time.Unix(sec, nsec), 5*time.Second)
}

// A watch sets each event's scope from a column, and Record and RecordMany
// store the scope they are given.
func TestScopeFromAWatchAndFromRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	exec(t, b.pool, "CREATE TABLE invoices (id int PRIMARY KEY, tenant_id int NOT NULL, status text)")
	require.NoError(t, outbox.InstallWatch(ctx, b.pool, Watch{Table: "invoices", Types: map[Op]string{OpInsert: "invoice.created"},
		ScopePrefix: "tenant:", ScopeColumn: "tenant_id"}))
	exec(t, b.pool, "INSERT INTO invoices VALUES (1, 42, 'open')")
	got := eventsOfType(t, b.pool, "invoice.created")
	require.Len(t, got, 1)
	require.Equal(t, "tenant:42", got[0].Scope)
	require.Equal(t, "invoice.created", got[0].Type)
	require.Equal(t, uuid.Version(7), got[0].ID.Version(), "trigger-made IDs are UUIDv7 too")
	sec, nsec := got[0].ID.Time().UnixTime()
	require.WithinDuration(t, time.Now(), time.Unix(sec, nsec), 5*time.Second)

	es := b.record(t, Event{Type: "a", Scope: "tenant:7"}, Event{Type: "b"})
	rows := loadRows(t, b.pool)
	require.Equal(t, "tenant:7", rows[es[0].ID].Scope)
	require.Empty(t, rows[es[1].ID].Scope)
	err := outbox.InstallWatch(ctx, b.pool, Watch{Table: "invoices", Name: "other", Types: map[Op]string{OpInsert: "x"}, ScopeColumn: "nope"})
	require.ErrorIs(t, err, ErrInvalidWatch)
	_, err = Record(ctx, nil, Event{Type: "a", Scope: strings.Repeat("s", MaxScopeLength+1)})
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "Scope", ve.Field)
}

// InstallWatch's go doc: "Installing the same spec again changes nothing",
// whatever the watch's literals hold (here a prefix reading like a notify
// call).
func TestInstallWatchOfAnUnchangedWatchWritesNothingWhateverItsPrefix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	createNotes(t, pool, 1)
	w := Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed"},
		SubjectPrefix: "urn:x-hooks:outbox_notify():"}
	require.NoError(t, outbox.InstallWatch(ctx, pool, w))
	xmin := func() string {
		var x string
		require.NoError(t, pool.QueryRow(ctx, `SELECT p.xmin::text FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
			WHERE t.tgrelid = 'corpus_notes'::regclass`).Scan(&x))
		return x
	}
	before := xmin()
	require.NoError(t, outbox.InstallWatch(ctx, pool, w))
	require.Equal(t, before, xmin(),
		"InstallWatch of an unchanged watch rewrote its function: a SubjectPrefix holding \"outbox_notify()\" reads as a notifying body")
}

// Processes installing one watch at once (pods starting together) never
// fail: the first install (without lockWatch they all found no triggers,
// all created the same own function, and all but one failed on pg_proc's
// unique index, 23505), and an install of a watch already up to date, which
// writes nothing.
func TestConcurrentInstallWatches(t *testing.T) {
	t.Parallel()
	for _, first := range []bool{true, false} {
		name := map[bool]string{true: "first install", false: "up to date"}[first]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.New(t)
			createNotes(t, pool, 1)
			w := Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed"}}
			require.NoError(t, outbox.InstallWatch(ctx, pool, w))
			for round := range 20 {
				if first {
					require.NoError(t, outbox.RemoveWatch(ctx, pool, "", "corpus_notes", ""))
				}
				const n = 8
				errs := make(chan error, n)
				start := make(chan struct{})
				for range n {
					go func() {
						<-start
						errs <- outbox.InstallWatch(ctx, pool, w)
					}()
				}
				close(start)
				for range n {
					require.NoError(t, <-errs, "round %d: one of %d InstallWatch calls at once failed", round, n)
				}
			}
		})
	}
}

// A watched table written by 16 concurrent transactions sends no
// notification, even with the SQL throttle at 0 (every outbox_record()
// notifies then), and every event is fanned out: the relay finds the rows by
// its re-checks and polls.
func TestWatchedTableWritesSendNoNotification(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	createNotes(t, b.pool, 16)
	require.NoError(t, outbox.InstallWatch(ctx, b.pool, Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed"}}))
	exec(t, b.pool, "UPDATE outbox_settings SET notify_interval = '0'")
	// The generic trigger function too, as a role that may not create
	// functions in the outbox's schema installs it.
	exec(t, b.pool, `CREATE TABLE corpus_generic (id int PRIMARY KEY, title text NOT NULL);
		INSERT INTO corpus_generic SELECT g, 't' FROM generate_series(1, 16) g;
		CREATE TRIGGER outbox_watch_events_update AFTER UPDATE ON corpus_generic FOR EACH ROW
		  EXECUTE FUNCTION outbox_watch('generic.changed', 'generic:', 'id', 'none', '', '')`)

	conn, err := pgx.Connect(ctx, b.url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "LISTEN "+statements.ChannelEvents)
	require.NoError(t, err)

	b.start(t)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "UPDATE corpus_notes SET title = title || '!' WHERE id = $1", i+1); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, "UPDATE corpus_generic SET title = title || '!' WHERE id = $1", i+1)
				return err
			}))
		}()
	}
	close(start)
	wg.Wait()
	waitFannedOut(t, b.pool, 10*time.Second)
	require.Len(t, eventsOfType(t, b.pool, "note.changed"), 16)
	require.Len(t, eventsOfType(t, b.pool, "generic.changed"), 16)

	// Control: the listener hears what outbox_record() sends.
	exec(t, b.pool, "SELECT outbox_record('control')")
	notifications := 0
	for {
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			break
		}
		notifications++
	}
	require.Equal(t, 1, notifications, "16 watched-table transactions and one outbox_record(): only outbox_record() notifies")
}

// A watch's DDL is what 0.1.0 generated, byte for byte: its fingerprint
// (each trigger's comment) is a hash of it, and a changed fingerprint makes
// the next InstallWatch of every installed watch drop and re-create its
// triggers, which takes an ACCESS EXCLUSIVE lock on the host's table.
func TestWatchDDLKeepsTheFingerprintsOfInstalledWatches(t *testing.T) {
	named, err := statements.For("My_Schema")
	require.NoError(t, err)
	w := Watch{Name: "x", Types: map[Op]string{OpUpdate: "a.c"}, Columns: []string{"t", "B"},
		SubjectPrefix: `n:'\`, Payload: PayloadColumns, PayloadColumns: []string{"t"}, ScopePrefix: "s", ScopeColumn: "sc"}
	ddls, err := w.triggerDDL(named, `"public"."tab"`, "id")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"outbox_watch_x_update": `CREATE TRIGGER "outbox_watch_x_update" AFTER UPDATE OF "t", "B" ON "public"."tab"` +
		` FOR EACH ROW WHEN (OLD."t" IS DISTINCT FROM NEW."t" OR OLD."B" IS DISTINCT FROM NEW."B")` +
		` EXECUTE FUNCTION "My_Schema"."outbox_watch"('a.c', E'n:''\\', 'id', 'columns', 's', 'sc', 't')`}, ddls)

	bare, err := statements.For("")
	require.NoError(t, err)
	w = Watch{Name: "y", Types: map[Op]string{OpUpdate: "a.c", OpDelete: "a.d"}}
	ddls, err = w.triggerDDL(bare, `"public"."tab"`, "")
	require.NoError(t, err)
	require.Equal(t, map[string]string{
		"outbox_watch_y_update": `CREATE TRIGGER "outbox_watch_y_update" AFTER UPDATE ON "public"."tab" FOR EACH ROW` +
			` WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION outbox_watch('a.c', '', '', '', '', '')`,
		"outbox_watch_y_delete": `CREATE TRIGGER "outbox_watch_y_delete" AFTER DELETE ON "public"."tab" FOR EACH ROW` +
			` EXECUTE FUNCTION outbox_watch('a.d', '', '', '', '', '')`,
	}, ddls)
	require.Equal(t, "standmeet/events watch 1b9cdd26f3f10f37b6b30543e3ebf4b0", watchFingerprint(ddls))
}

// The version-7 UUID is defined once, in outbox_uuidv7 (migration 003):
// since migration 007 the watch trigger calls it instead of writing its
// bytes out again, and its IDs are version 7, sorted by time, as
// outbox_record's are.
func TestWatchTriggerMakesItsIDsWithOutboxUUIDv7(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	var watchSrc, uuidSrc string
	require.NoError(t, pool.QueryRow(ctx, "SELECT prosrc FROM pg_proc WHERE oid = 'outbox_watch()'::regprocedure").Scan(&watchSrc))
	require.NoError(t, pool.QueryRow(ctx, "SELECT prosrc FROM pg_proc WHERE oid = 'outbox_uuidv7()'::regprocedure").Scan(&uuidSrc))
	require.Contains(t, watchSrc, "outbox_uuidv7()")
	require.NotContains(t, watchSrc, "int8send", "the trigger builds a UUID of its own again")
	require.Contains(t, uuidSrc, "int8send")

	exec(t, pool, "CREATE TABLE notes_v7 (id int PRIMARY KEY)")
	require.NoError(t, Outbox{}.InstallWatch(ctx, pool, Watch{Table: "notes_v7", Types: map[Op]string{OpInsert: "note.created"}}))
	exec(t, pool, "INSERT INTO notes_v7 SELECT g FROM generate_series(1, 50) g")
	rows, err := pool.Query(ctx, "SELECT id FROM outbox_events WHERE type = 'note.created' ORDER BY seq")
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	require.NoError(t, err)
	require.Len(t, ids, 50)
	for i, id := range ids {
		require.Equal(t, uuid.Version(7), id.Version(), "%s", id)
		require.Equal(t, uuid.RFC4122, id.Variant(), "%s", id)
		if i > 0 {
			require.Negative(t, bytes.Compare(ids[i-1][:], id[:]), "IDs made one after another must sort: %s then %s", ids[i-1], id)
		}
	}
	sec, nsec := ids[len(ids)-1].Time().UnixTime()
	require.WithinDuration(t, time.Now(), time.Unix(sec, nsec), 5*time.Second)
}
