package events

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/standmeet/events/internal/statements"
)

// Op is a kind of write a [Watch] records events for.
type Op string

// The operations a watch can cover.
const (
	OpInsert Op = "INSERT"
	OpUpdate Op = "UPDATE"
	OpDelete Op = "DELETE"
)

// PayloadMode says what a watch puts in its events' payload.
type PayloadMode string

// Payload modes of a [Watch].
const (
	// PayloadNone records {}.
	PayloadNone PayloadMode = "none"
	// PayloadRow records the row as a JSON object: the new row, or the old
	// one for DELETE.
	PayloadRow PayloadMode = "row"
	// PayloadOldNew records {"old": …, "new": …}, with null for the side an
	// INSERT or DELETE does not have.
	PayloadOldNew PayloadMode = "old_new"
	// PayloadColumns records only [Watch.PayloadColumns], as a JSON object.
	PayloadColumns PayloadMode = "columns"
)

// Watch describes a trigger that records events for writes to a host table,
// including writes that never pass through Go (psql, other services, bulk
// SQL). The events are recorded in the writer's transaction and are ordinary
// events in every way. Install it with [Outbox.InstallWatch].
type Watch struct {
	// Table is the watched table. TableSchema qualifies it; empty means the
	// search_path decides.
	Table, TableSchema string

	// Name tells this watch's triggers apart from other watches on the same
	// table. Defaults to "events". Letters, digits and '_'.
	Name string

	// Types maps each operation to watch to the type of the events it
	// records, for example {OpUpdate: "corpus.note.changed"}. At least one.
	Types map[Op]string

	// Columns limits UPDATE events to updates where at least one of these
	// columns actually changed (IS DISTINCT FROM its old value). Empty means
	// an UPDATE that changes anything in the row.
	Columns []string

	// SubjectPrefix and SubjectColumn form each event's subject:
	// SubjectPrefix followed by the value of SubjectColumn, for example
	// "note:" and "id" give "note:42". SubjectColumn defaults to the table's
	// primary key when that is a single column; set SubjectColumn to "-" for
	// no column (the subject is then SubjectPrefix alone).
	SubjectPrefix, SubjectColumn string

	// ScopePrefix and ScopeColumn form each event's scope, like the subject:
	// ScopePrefix followed by the value of ScopeColumn (empty: none), for
	// example "tenant:" and "tenant_id". Both empty: no scope.
	ScopePrefix, ScopeColumn string

	// Payload says what the payload holds. Defaults to PayloadNone.
	Payload PayloadMode

	// PayloadColumns are the columns recorded with PayloadColumns.
	PayloadColumns []string
}

var watchNameRE = regexp.MustCompile(`^[A-Za-z0-9_]{1,20}$`)

// Beginner starts a transaction: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx
// (which starts a savepoint).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// InstallWatch installs w's triggers, replacing any triggers the same watch
// (same table and Name) had, in one transaction. Installing the same spec
// again changes nothing and takes no lock on the table (each trigger carries
// a fingerprint of its spec in its comment, compared first), so calling it at
// every service start is cheap; installing another spec replaces the old one
// atomically (that takes the table's ACCESS EXCLUSIVE lock briefly, like any
// DROP TRIGGER).
// Table and column names are checked against the catalog and quoted as
// identifiers; an error wrapping [ErrInvalidWatch] names what is wrong.
//
// Each trigger calls a function of its own, which InstallWatch writes in o's
// schema (the search_path's for the zero Outbox) with the watch's constants
// and columns spelled out; it records what the library's generic
// outbox_watch() records, faster. A role that may not create functions in
// that schema gets triggers calling outbox_watch(). A watch whose spec is
// installed on the generic function (by an earlier release) is moved to its
// own functions only if the table's lock comes within 100 ms; otherwise it
// is left as it is, and a later InstallWatch tries again.
//
// The triggers send no notification (a check per written row inside the
// host's transaction cost a tenth of a watched table's write throughput):
// relays find their rows by re-checking after activity and by polling, so a
// lone write on an idle system is fanned out within
// [ListenerConfig.PollInterval].
//
// Processes that install the same watch at once (a deploy starting its pods
// together) take turns: each InstallWatch holds a transaction-level advisory
// lock on the table and watch name while it reads and writes them.
func (o Outbox) InstallWatch(ctx context.Context, db Beginner, w Watch) error {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return err
	}
	if w.Name == "" {
		w.Name = "events"
	}
	if w.Payload == "" {
		w.Payload = PayloadNone
	}
	if err := w.validate(); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		table, err := resolveTable(ctx, tx, sql, w.TableSchema, w.Table)
		if err != nil {
			return err
		}
		if err := lockWatch(ctx, tx, sql, table, w.Name); err != nil {
			return err
		}
		cols, pk, err := tableColumns(ctx, tx, sql, table)
		if err != nil {
			return err
		}
		subjectCol, err := w.checkColumns(table, cols, pk)
		if err != nil {
			return err
		}
		ddls, err := w.triggerDDL(sql, table, subjectCol)
		if err != nil {
			return err
		}
		fingerprint := watchFingerprint(ddls)
		var (
			schema    string
			canCreate bool
		)
		if err := tx.QueryRow(ctx, sql.WatchSchema, sql.WatchFunction+"()").Scan(&schema, &canCreate); err != nil {
			return fmt.Errorf("events: install watch: the outbox's trigger function: %w (run Migrate first)", err)
		}
		triggers := map[string]watchTrigger{}
		if canCreate {
			if triggers, err = w.ownTriggers(sql, schema, table, subjectCol, ddls); err != nil {
				return err
			}
		}
		// Unchanged: touch nothing. Dropping a trigger takes an ACCESS
		// EXCLUSIVE lock on the host's table, and every service start calls
		// InstallWatch.
		installed, err := watchTriggers(ctx, tx, sql, table, w.Name)
		if err != nil || watchUpToDate(installed, ddls, triggers, fingerprint) {
			return err
		}
		if !watchSpecInstalled(installed, ddls, fingerprint) {
			return replaceWatch(ctx, tx, sql, table, schema, ddls, triggers, installed, fingerprint)
		}
		return upgradeWatch(ctx, tx, sql, table, schema, ddls, triggers, installed, fingerprint)
	})
}

// lockWatch makes InstallWatch and RemoveWatch calls for the watch called
// name on table (qualified) take turns until tx ends. Without it, calls at
// once (pods starting together) each found no function and created it, and
// all but one failed on pg_proc's unique index. The lock is an advisory one:
// nothing else waits on it, and the table is not locked.
func lockWatch(ctx context.Context, tx pgx.Tx, sql *statements.Set, table, name string) error {
	if _, err := tx.Exec(ctx, sql.LockWatch, table+" "+name); err != nil {
		return fmt.Errorf("events: watch %s on %s: %w", name, table, err)
	}
	return nil
}

// upgradeLockTimeout bounds how long InstallWatch waits for a table's lock
// when the spec is installed already and only its trigger function changes
// (the generic one to the watch's own, after an upgrade): a service starting
// must not queue the table's writers behind a long transaction for that.
const upgradeLockTimeout = 100 * time.Millisecond

// upgradeWatch replaces an installed watch whose spec is current by the same
// triggers calling functions of their own, in a savepoint, waiting at most
// upgradeLockTimeout for the table: if it cannot have the lock, the watch
// stays as it was (it records the same rows) and a later InstallWatch tries
// again.
func upgradeWatch(ctx context.Context, tx pgx.Tx, sql *statements.Set, table, schema string, ddls map[string]string,
	triggers map[string]watchTrigger, installed map[string]installedTrigger, fingerprint string,
) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	defer sp.Rollback(ctx) // after Commit: nothing to roll back
	var before string      // the caller's, put back after: a released savepoint keeps what it set
	if err := sp.QueryRow(ctx, sql.Setting, "lock_timeout").Scan(&before); err != nil {
		return err
	}
	if _, err := sp.Exec(ctx, sql.SetLocal, "lock_timeout", strconv.FormatInt(upgradeLockTimeout.Milliseconds(), 10)); err != nil {
		return err
	}
	err = replaceWatch(ctx, sp, sql, table, schema, ddls, triggers, installed, fingerprint)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.LockNotAvailable {
		return sp.Rollback(ctx)
	}
	if err != nil {
		return err
	}
	if _, err := sp.Exec(ctx, sql.SetLocal, "lock_timeout", before); err != nil {
		return err
	}
	return sp.Commit(ctx)
}

// replaceWatch drops the installed triggers of a watch and creates those of
// ddls, each calling its own function of triggers where it has one, each
// commented with fingerprint.
func replaceWatch(ctx context.Context, tx pgx.Tx, sql *statements.Set, table, schema string, ddls map[string]string,
	triggers map[string]watchTrigger, installed map[string]installedTrigger, fingerprint string,
) error {
	if err := dropWatch(ctx, tx, sql, table, schema, installed); err != nil {
		return err
	}
	for name, ddl := range ddls {
		if t, ok := triggers[name]; ok {
			if _, err := tx.Exec(ctx, t.create); err != nil {
				return fmt.Errorf("events: install watch on %s: its trigger function: %w", table, err)
			}
			ddl = t.own
		}
		if _, err := tx.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("events: install watch on %s: %w", table, err)
		}
		comment, err := statements.Render(sql.CommentWatchTrigger, map[string]string{
			"trigger": pgx.Identifier{name}.Sanitize(), "table": table, "comment": statements.Literal(fingerprint)})
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, comment); err != nil {
			return fmt.Errorf("events: install watch on %s: %w", table, err)
		}
	}
	return nil
}

// checkColumns checks that the columns w names are among table's cols, and
// returns the subject column: w's, or the single-column primary key pk when
// w names none, or "" for none ("-").
func (w *Watch) checkColumns(table string, cols, pk []string) (string, error) {
	has := func(c string) bool { return slices.Contains(cols, c) }
	for _, c := range append(slices.Clone(w.Columns), w.PayloadColumns...) {
		if !has(c) {
			return "", invalidf(ErrInvalidWatch, "Columns", "table %s has no column %q", table, c)
		}
	}
	subjectCol := w.SubjectColumn
	switch {
	case subjectCol == "-":
		subjectCol = ""
	case subjectCol == "" && len(pk) == 1:
		subjectCol = pk[0]
	case subjectCol == "":
		return "", invalidf(ErrInvalidWatch, "SubjectColumn", "is empty and table %s has no single-column primary key: set it (or \"-\" for none)", table)
	case !has(subjectCol):
		return "", invalidf(ErrInvalidWatch, "SubjectColumn", "table %s has no column %q", table, subjectCol)
	}
	if w.ScopeColumn != "" && !has(w.ScopeColumn) {
		return "", invalidf(ErrInvalidWatch, "ScopeColumn", "table %s has no column %q", table, w.ScopeColumn)
	}
	return subjectCol, nil
}

// triggerDDL returns the CREATE TRIGGER statement of each trigger of w, by
// trigger name, on table: sql's CreateWatchTrigger with w's identifiers and
// arguments, quoted, calling the generic outbox_watch().
func (w *Watch) triggerDDL(sql *statements.Set, table, subjectCol string) (map[string]string, error) {
	out := map[string]string{}
	for _, op := range []Op{OpInsert, OpUpdate, OpDelete} {
		if _, ok := w.Types[op]; !ok {
			continue
		}
		ddl, err := w.triggerSQL(sql, op, table, subjectCol, sql.WatchFunction)
		if err != nil {
			return nil, err
		}
		out[triggerName(w.Name, op)] = ddl
	}
	return out, nil
}

// triggerSQL returns the CREATE TRIGGER statement of w's trigger for op on
// table, calling function (qualified) with the spec as its arguments.
func (w *Watch) triggerSQL(sql *statements.Set, op Op, table, subjectCol, function string) (string, error) {
	args := []string{w.Types[op], w.SubjectPrefix, subjectCol, string(w.Payload), w.ScopePrefix, w.ScopeColumn}
	if w.Payload == PayloadColumns {
		args = append(args, w.PayloadColumns...)
	}
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = statements.Literal(a)
	}
	event, when := string(op), ""
	if op == OpUpdate {
		if len(w.Columns) > 0 {
			var of, changed []string
			for _, c := range w.Columns {
				id := pgx.Identifier{c}.Sanitize()
				of = append(of, id)
				changed = append(changed, "OLD."+id+" IS DISTINCT FROM NEW."+id)
			}
			event += " OF " + strings.Join(of, ", ")
			when = " WHEN (" + strings.Join(changed, " OR ") + ")"
		} else {
			when = " WHEN (OLD.* IS DISTINCT FROM NEW.*)"
		}
	}
	return statements.Render(sql.CreateWatchTrigger, map[string]string{"trigger": pgx.Identifier{triggerName(w.Name, op)}.Sanitize(),
		"event": event, "table": table, "when": when, "function": function, "function_args": strings.Join(quoted, ", ")})
}

// ownTriggers returns w's triggers on table (see watchfn.go), by trigger
// name, each calling a function of its own in schema, the outbox's, named
// after its generic definition in generic.
func (w *Watch) ownTriggers(sql *statements.Set, schema, table, subjectCol string, generic map[string]string) (map[string]watchTrigger, error) {
	out := map[string]watchTrigger{}
	for _, op := range []Op{OpInsert, OpUpdate, OpDelete} {
		name := triggerName(w.Name, op)
		ddl, ok := generic[name]
		if !ok {
			continue
		}
		fn := watchFunctionName(ddl)
		create, err := w.functionDDL(sql, schema, fn, op, subjectCol)
		if err != nil {
			return nil, err
		}
		own, err := w.triggerSQL(sql, op, table, subjectCol, pgx.Identifier{schema, fn}.Sanitize())
		if err != nil {
			return nil, err
		}
		out[name] = watchTrigger{own: own, function: fn, create: create}
	}
	return out, nil
}

// watchFingerprint names a set of trigger definitions. It is stored as each
// trigger's comment, so a later InstallWatch can tell an unchanged watch
// without comparing PostgreSQL's rewritten trigger definitions.
func watchFingerprint(ddls map[string]string) string {
	h := sha256.New()
	for _, name := range slices.Sorted(maps.Keys(ddls)) {
		h.Write([]byte(ddls[name]))
		h.Write([]byte{0})
	}
	return "standmeet/events watch " + hex.EncodeToString(h.Sum(nil)[:16])
}

// installedTrigger is a trigger of a watch as the catalog has it.
type installedTrigger struct {
	comment, function string
	mayDrop           bool // this role may drop the function
}

// watchTriggers reads the triggers table has among the trigger names of the
// watch called name. It reads the catalog only: no lock on table.
func watchTriggers(ctx context.Context, tx pgx.Tx, sql *statements.Set, table, name string) (map[string]installedTrigger, error) {
	var names []string
	for _, op := range []Op{OpInsert, OpUpdate, OpDelete} {
		names = append(names, triggerName(name, op))
	}
	rows, err := tx.Query(ctx, sql.WatchTriggers, table, names)
	if err != nil {
		return nil, fmt.Errorf("events: watch: triggers of %s: %w", table, err)
	}
	var (
		trigger string
		t       installedTrigger
	)
	installed := map[string]installedTrigger{}
	if _, err := pgx.ForEachRow(rows, []any{&trigger, &t.comment, &t.function, &t.mayDrop}, func() error {
		installed[trigger] = t
		return nil
	}); err != nil {
		return nil, fmt.Errorf("events: watch: triggers of %s: %w", table, err)
	}
	return installed, nil
}

// watchUpToDate reports whether installed is the spec of ddls
// (watchSpecInstalled) with each trigger calling its own function of own, or
// the generic one where own has none.
func watchUpToDate(installed map[string]installedTrigger, ddls map[string]string, own map[string]watchTrigger, fingerprint string) bool {
	if !watchSpecInstalled(installed, ddls, fingerprint) {
		return false
	}
	for name := range ddls {
		want := "outbox_watch"
		if o, has := own[name]; has {
			want = o.function
		}
		if installed[name].function != want {
			return false
		}
	}
	return true
}

// watchSpecInstalled reports whether installed is exactly the triggers of
// ddls, each carrying fingerprint, whatever function each calls.
func watchSpecInstalled(installed map[string]installedTrigger, ddls map[string]string, fingerprint string) bool {
	if len(installed) != len(ddls) {
		return false
	}
	for name := range ddls {
		if t, ok := installed[name]; !ok || t.comment != fingerprint {
			return false
		}
	}
	return true
}

// RemoveWatch removes the triggers of the watch named name (default
// "events") on table. Removing a watch that is not there does nothing.
func (o Outbox) RemoveWatch(ctx context.Context, db Beginner, tableSchema, table, name string) error {
	if name == "" {
		name = "events"
	}
	if !watchNameRE.MatchString(name) {
		return invalidf(ErrInvalidWatch, "Name", "%q: 1 to 20 letters, digits and '_'", name)
	}
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		qualified, err := resolveTable(ctx, tx, sql, tableSchema, table)
		if err != nil {
			return err
		}
		if err := lockWatch(ctx, tx, sql, qualified, name); err != nil {
			return err
		}
		installed, err := watchTriggers(ctx, tx, sql, qualified, name)
		if err != nil {
			return err
		}
		var schema string
		if err := tx.QueryRow(ctx, sql.WatchSchema, sql.WatchFunction+"()").Scan(&schema, new(bool)); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("events: remove watch: the outbox's trigger function: %w", err)
		}
		return dropWatch(ctx, tx, sql, qualified, schema, installed)
	})
}

func (w *Watch) validate() error {
	bad := func(field, format string, args ...any) error {
		return invalidf(ErrInvalidWatch, field, format, args...)
	}
	switch {
	case w.Table == "":
		return bad("Table", "is empty")
	case !watchNameRE.MatchString(w.Name):
		return bad("Name", "%q: 1 to 20 letters, digits and '_'", w.Name)
	case len(w.Types) == 0:
		return bad("Types", "is empty: map at least one of OpInsert, OpUpdate, OpDelete to an event type")
	}
	for op, typ := range w.Types {
		if op != OpInsert && op != OpUpdate && op != OpDelete {
			return bad("Types", "unknown operation %q", op)
		}
		if err := ValidateType(typ); err != nil {
			return bad("Types["+string(op)+"]", "%v", err)
		}
	}
	switch w.Payload {
	case PayloadNone, PayloadRow, PayloadOldNew:
		if len(w.PayloadColumns) > 0 {
			return bad("PayloadColumns", "is set but Payload is %q, not %q", w.Payload, PayloadColumns)
		}
	case PayloadColumns:
		if len(w.PayloadColumns) == 0 {
			return bad("PayloadColumns", "is empty but Payload is %q", PayloadColumns)
		}
	default:
		return bad("Payload", "%q: use PayloadNone, PayloadRow, PayloadOldNew or PayloadColumns", w.Payload)
	}
	if strings.ContainsRune(w.SubjectPrefix, 0) {
		return bad("SubjectPrefix", "contains a NUL byte")
	}
	if strings.ContainsRune(w.ScopePrefix, 0) {
		return bad("ScopePrefix", "contains a NUL byte")
	}
	return nil
}

// resolveTable returns the quoted, schema-qualified name of an existing
// table, or an error naming the one that does not exist.
func resolveTable(ctx context.Context, tx pgx.Tx, sql *statements.Set, schema, table string) (string, error) {
	name := pgx.Identifier{table}
	if schema != "" {
		name = pgx.Identifier{schema, table}
	}
	var nsp, rel *string
	err := tx.QueryRow(ctx, sql.ResolveTable, name.Sanitize()).Scan(&nsp, &rel)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && rel == nil) {
		return "", invalidf(ErrInvalidWatch, "Table", "%s does not exist", name.Sanitize())
	}
	if err != nil {
		return "", fmt.Errorf("events: watch: looking up %s: %w", name.Sanitize(), err)
	}
	return pgx.Identifier{*nsp, *rel}.Sanitize(), nil
}

// tableColumns lists a table's columns and its primary key's columns.
func tableColumns(ctx context.Context, tx pgx.Tx, sql *statements.Set, table string) (cols, pk []string, err error) {
	rows, err := tx.Query(ctx, sql.TableColumns, table)
	if err != nil {
		return nil, nil, fmt.Errorf("events: watch: columns of %s: %w", table, err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var inPK bool
		if err := rows.Scan(&name, &inPK); err != nil {
			return nil, nil, err
		}
		cols = append(cols, name)
		if inPK {
			pk = append(pk, name)
		}
	}
	return cols, pk, rows.Err()
}

// dropWatch drops the installed triggers of a watch on table, and the
// functions of their own in schema that this role may drop (another's are
// left, unused).
func dropWatch(ctx context.Context, tx pgx.Tx, sql *statements.Set, table, schema string, installed map[string]installedTrigger) error {
	for name, t := range installed {
		drop, err := statements.Render(sql.DropWatchTrigger, map[string]string{"trigger": pgx.Identifier{name}.Sanitize(), "table": table})
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, drop); err != nil {
			return fmt.Errorf("events: watch: dropping the triggers on %s: %w", table, err)
		}
		if !strings.HasPrefix(t.function, watchFunctionPrefix) || !t.mayDrop {
			continue
		}
		dropFn, err := statements.Render(sql.DropWatchFunction, map[string]string{"function": pgx.Identifier{schema, t.function}.Sanitize()})
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, dropFn); err != nil {
			return fmt.Errorf("events: watch: dropping the trigger function of %s: %w", name, err)
		}
	}
	return nil
}

func triggerName(name string, op Op) string {
	return "outbox_watch_" + name + "_" + strings.ToLower(string(op))
}

// ListWatches lists the watches installed on any table whose triggers call
// o's schema's trigger function, by table and name. SubjectColumn is "-" for a watch without one; the spec is read back from
// the triggers' arguments.
func (o Outbox) ListWatches(ctx context.Context, db DB) ([]Watch, error) {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, sql.ListWatches, sql.WatchFunction+"()")
	if err != nil {
		return nil, fmt.Errorf("events: list watches: %w", err)
	}
	var (
		out                   []Watch
		schema, table, tgname string
		args                  []byte
		tgtype                int
	)
	_, err = pgx.ForEachRow(rows, []any{&schema, &table, &tgname, &args, &tgtype}, func() error {
		name := strings.TrimPrefix(tgname, "outbox_watch_")
		i := strings.LastIndexByte(name, '_')
		if i < 0 {
			return nil
		}
		op := Op(strings.ToUpper(name[i+1:]))
		name = name[:i]
		a := strings.Split(strings.TrimSuffix(string(args), "\x00"), "\x00")
		if len(a) < 6 {
			return nil // installed before this version: reinstall it
		}
		if n := len(out); n == 0 || out[n-1].TableSchema != schema || out[n-1].Table != table || out[n-1].Name != name {
			w := Watch{Table: table, TableSchema: schema, Name: name, Types: map[Op]string{},
				SubjectPrefix: a[1], SubjectColumn: cmp.Or(a[2], "-"), Payload: PayloadMode(a[3]),
				ScopePrefix: a[4], ScopeColumn: a[5]}
			if w.Payload == PayloadColumns {
				w.PayloadColumns = a[6:]
			}
			out = append(out, w)
		}
		out[len(out)-1].Types[op] = a[0]
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("events: list watches: %w", err)
	}
	return out, nil
}
