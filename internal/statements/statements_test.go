package statements

import (
	"reflect"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
)

// The files and the Set say the same: every query field has its query, and
// every query in the files is a field's. (The package's initialisation
// panics otherwise; this says which.)
func TestEveryQueryOfTheSetIsInTheFilesAndNoOtherIs(t *testing.T) {
	queries, err := parse(files)
	require.NoError(t, err)
	require.NoError(t, fill(new(Set), queries))
	require.Greater(t, len(queries), 90)
}

func TestFillNamesTheMissingAndTheUnusedQueries(t *testing.T) {
	fsys := fstest.MapFS{
		"a.sql": {Data: []byte("-- Area a.\n\n-- name: One\nSELECT 1;\n\n-- name: Stray\nSELECT 2;\n")},
	}
	queries, err := parse(fsys)
	require.NoError(t, err)
	var set struct {
		One     string
		Missing string
		Nested  struct{ AlsoMissing string }
		Skipped string `sql:"-"`
	}
	err = fill(&set, queries)
	require.Error(t, err)
	require.Contains(t, err.Error(), "query Missing: no .sql file names it")
	require.Contains(t, err.Error(), "query AlsoMissing: no .sql file names it")
	require.Contains(t, err.Error(), "a.sql: query Stray is not used by any field")
	require.NotContains(t, err.Error(), "Skipped")
	require.Equal(t, "SELECT 1", set.One)
}

func TestParseRefusesWhatItCannotPlace(t *testing.T) {
	for name, tc := range map[string]struct{ files fstest.MapFS }{
		"query named twice": {fstest.MapFS{
			"a.sql": {Data: []byte("-- name: One\nSELECT 1;\n")},
			"b.sql": {Data: []byte("-- name: One\nSELECT 2;\n")},
		}},
		"SQL before the first marker": {fstest.MapFS{"a.sql": {Data: []byte("SELECT 0;\n-- name: One\nSELECT 1;\n")}}},
		"empty query":                 {fstest.MapFS{"a.sql": {Data: []byte("-- name: One\n-- nothing\n-- name: Two\nSELECT 2;\n")}}},
		"unknown template":            {fstest.MapFS{"a.sql": {Data: []byte("-- name: One\nSELECT * FROM /* TEMPLATE: shema */outbox_events;\n")}}},
		"schema template without name": {fstest.MapFS{
			"a.sql": {Data: []byte("-- name: One\nSELECT * FROM /* TEMPLATE: schema */ outbox_events;\n")},
		}},
		"malformed template": {fstest.MapFS{"a.sql": {Data: []byte("-- name: One\nSELECT /* TEMPLATE:schema */1;\n")}}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parse(tc.files)
			require.Error(t, err)
		})
	}
}

func TestAQueryIsItsTextWithoutCommentLinesOrSemicolon(t *testing.T) {
	queries, err := parse(fstest.MapFS{"a.sql": {Data: []byte(
		"-- The file's own words.\n\n-- name: One\n-- What One does.\nSELECT 1\n  -- a remark\n  FROM t; -- kept: not a whole line\n\n-- name: Two\nSELECT 2;\n")}})
	require.NoError(t, err)
	require.Equal(t, "SELECT 1\n  FROM t; -- kept: not a whole line", queries["One"].sql)
	require.Equal(t, "SELECT 2", queries["Two"].sql)
}

// The schema is substituted one way: every table and function of the
// library and River becomes its qualified, quoted name; the search_path's
// Set sends the bare names; the channels are the schema's.
func TestASchemasSetNamesOnlyItsOwnTablesAndChannels(t *testing.T) {
	named, err := For("Tenant_1")
	require.NoError(t, err)
	bare, err := For("")
	require.NoError(t, err)
	literal := regexp.MustCompile(`'[^']*'`)
	libraryName := regexp.MustCompile(`\b(outbox_[a-z_]+|webhook_[a-z_]+|river_job)\b`)
	qualified := regexp.MustCompile(`"Tenant_1"\."(outbox_[a-z_]+|webhook_[a-z_]+|river_job)"`)
	queries(t, named, func(name, sql string) {
		require.NotContains(t, sql, "/* TEMPLATE: schema */", name)
		require.NotContains(t, sql, "TEMPLATE_BEGIN", name)
		// Every library name is qualified (column names such as
		// outbox_events.seq do not occur: statements use aliases), string
		// literals aside.
		sql = literal.ReplaceAllStringFunc(sql, func(s string) string { return strings.Repeat("_", len(s)) })
		for _, loc := range libraryName.FindAllStringIndex(sql, -1) {
			start := max(0, loc[0]-len(`"Tenant_1".""`))
			if !qualified.MatchString(sql[start:min(len(sql), loc[1]+1)]) {
				t.Errorf("%s: %s is not qualified: …%s…", name, sql[loc[0]:loc[1]], sql[start:min(len(sql), loc[1]+20)])
			}
		}
	})
	// The library's channels are qualified; River's insert channel (a
	// statement that releases jobs tells River's producers) is named from
	// a parameter, the schema, as River names it.
	queries(t, named, func(name, sql string) {
		if strings.Contains(sql, "pg_notify(") {
			require.Regexp(t, `pg_notify\(('Tenant_1\.standmeet_events(_fanned)?'|concat\(coalesce\(\$\d+::text, current_schema\(\)\), '\.river_insert'\))`, sql, name)
		}
	})
	queries(t, bare, func(name, sql string) {
		require.NotContains(t, sql, `"`, name)
		if strings.Contains(sql, "pg_notify(") {
			require.Regexp(t, `pg_notify\(('standmeet_events(_fanned)?'|concat\(coalesce\(\$\d+::text, current_schema\(\)\), '\.river_insert'\))`, sql, name)
		}
	})
	require.Equal(t, `"Tenant_1"."outbox_watch"`, named.WatchFunction)
	require.Equal(t, named.ListPoisoned, named.List["poisoned"])
	require.Len(t, named.List, 4)
}

// Only the DDL that names what it creates keeps templates past the build,
// and Render fills every one of them or says which is left.
func TestOnlyCallTimeTemplatesOutliveTheBuild(t *testing.T) {
	s, err := For("s")
	require.NoError(t, err)
	callTime := map[string]map[string]string{
		"CreateWatchTrigger": {"trigger": `"t"`, "event": "INSERT", "table": `"x"`, "when": "", "function": s.WatchFunction,
			"function_args": "'a'"},
		"CommentWatchTrigger": {"trigger": `"t"`, "table": `"x"`, "comment": "'c'"},
		"DropWatchTrigger":    {"trigger": `"t"`, "table": `"x"`},
		"CreateSchema":        {"schema_name": `"s"`},
		"CreateWatchFunction": {"function": `"s"."outbox_watch_0123456789abcdef"`, "schema_name": `"s"`, "tag": "$t$",
			"type": "'a'", "subject": "''", "payload": "'{}'::jsonb", "scope": "''"},
		"DropWatchFunction": {"function": `"s"."outbox_watch_0123456789abcdef"`},
	}
	queries(t, s, func(name, sql string) {
		values, ok := callTime[name]
		if !ok {
			require.NotContains(t, sql, "TEMPLATE", name)
			return
		}
		require.Contains(t, sql, "TEMPLATE", name)
		out, err := Render(sql, values)
		require.NoError(t, err, name)
		require.NotContains(t, out, "TEMPLATE", name)
	})
	_, err = Render(s.DropWatchTrigger, map[string]string{"trigger": `"t"`})
	require.ErrorContains(t, err, "a template has no value")
	ddl, err := Render(s.CreateWatchTrigger, callTime["CreateWatchTrigger"])
	require.NoError(t, err)
	require.Equal(t, `CREATE TRIGGER "t" AFTER INSERT ON "x" FOR EACH ROW EXECUTE FUNCTION "s"."outbox_watch"('a')`, ddl)
}

func TestForRefusesABadSchemaNameAndSharesEachSet(t *testing.T) {
	_, err := For("bad-name")
	require.ErrorIs(t, err, ErrSchema)
	a, err := For("shared")
	require.NoError(t, err)
	b, err := For("shared")
	require.NoError(t, err)
	require.Same(t, a, b)
}

// queries calls f with every query field of s.
func queries(t *testing.T, s *Set, f func(name, sql string)) {
	t.Helper()
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		for i := range v.NumField() {
			field := v.Type().Field(i)
			switch {
			case field.Tag.Get("sql") == "-":
			case field.Type.Kind() == reflect.String:
				f(field.Name, v.Field(i).String())
			case field.Type.Kind() == reflect.Struct:
				walk(v.Field(i))
			}
		}
	}
	walk(reflect.ValueOf(s).Elem())
}
