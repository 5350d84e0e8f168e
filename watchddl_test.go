package events

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/statements"
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
