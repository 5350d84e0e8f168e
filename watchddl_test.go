package events

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/statements"
	"github.com/standmeet/events/internal/testdb"
)

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
