package statements

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"regexp"
	"slices"
	"strings"
)

// The named queries, one file per area. Each query starts at a marker line
//
//	-- name: ClaimBatch
//
// (sqlc's form) and runs to the next marker or the end of the file; the
// comment lines under the marker document it and are not sent. Text above
// the first marker is the file's own commentary.
//
//go:embed *.sql
var files embed.FS

// Templates, in the form of River's sqlctemplate, so that every file stays
// valid SQL for the search_path's schema and can be pasted into psql as it
// is:
//
//   - /* TEMPLATE: schema */outbox_events, before every table and function of
//     the library and River, becomes the name qualified by the schema and
//     quoted ("s"."outbox_events"), or the bare name for the search_path:
//     the statements sent are what the Go-built ones were, byte for byte;
//   - /* TEMPLATE_BEGIN: name */ default /* TEMPLATE_END */ is replaced,
//     default and all: the channels, whose literal is the default schema's;
//   - /* TEMPLATE: name */ alone is replaced by a value.
//
// Build-time templates are replaced once per schema, when its Set is built.
// Call-time templates are what must stay dynamic (the identifiers of a
// watch's trigger DDL, the schema Migrate creates): [Render] fills them in
// per call.
var (
	qualifiedRE    = regexp.MustCompile(`/\* TEMPLATE: schema \*/([a-z_][a-z0-9_]*)`)
	templateRE     = regexp.MustCompile(`/\* TEMPLATE: ([a-z_]+) \*/`)
	templateSpanRE = regexp.MustCompile(`/\* TEMPLATE_BEGIN: ([a-z_]+) \*/.*?/\* TEMPLATE_END \*/`)
	templateLeftRE = regexp.MustCompile(`/\*\s*TEMPLATE`)
	markerRE       = regexp.MustCompile(`^-- name: ([A-Za-z][A-Za-z0-9]*)\s*$`)
	buildTemplates = []string{"channel_events", "channel_fanned"}
	callTemplates  = []string{"trigger", "table", "event", "when", "function", "function_args", "comment", "schema_name",
		"tag", "type", "subject", "payload", "scope"}
)

// query is one named query as its file holds it.
type query struct {
	file, sql string
}

// parse reads every .sql file of fsys into named queries. A name used twice,
// SQL outside a query, an empty query or a template name that is not known
// is an error.
func parse(fsys fs.FS) (map[string]query, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	out := map[string]query{}
	var errs []error
	for _, file := range names {
		body, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, err
		}
		for name, sql := range split(file, string(body), &errs) {
			if q, dup := out[name]; dup {
				errs = append(errs, fmt.Errorf("%s: query %s is already named in %s", file, name, q.file))
				continue
			}
			if err := checkTemplates(sql); err != nil {
				errs = append(errs, fmt.Errorf("%s: query %s: %w", file, name, err))
			}
			out[name] = query{file: file, sql: sql}
		}
	}
	return out, errors.Join(errs...)
}

// checkTemplates refuses a template name that is neither build-time nor
// call-time, and a schema template not followed by a name.
func checkTemplates(sql string) error {
	sql = qualifiedRE.ReplaceAllString(sql, "")
	sql = templateSpanRE.ReplaceAllStringFunc(sql, func(m string) string {
		return "/* TEMPLATE: " + templateSpanRE.FindStringSubmatch(m)[1] + " */"
	})
	for _, m := range templateRE.FindAllStringSubmatch(sql, -1) {
		if !slices.Contains(buildTemplates, m[1]) && !slices.Contains(callTemplates, m[1]) {
			return fmt.Errorf("unknown template %q (the schema's must precede a name)", m[1])
		}
	}
	if templateLeftRE.MatchString(templateRE.ReplaceAllString(sql, "")) {
		return errors.New("a malformed template")
	}
	return nil
}

// split cuts one file into its queries, without their comment lines and
// final semicolon.
func split(file, body string, errs *[]error) map[string]string {
	out := map[string]string{}
	var (
		name  string
		lines []string
	)
	flush := func() {
		sql := strings.TrimRight(strings.TrimSpace(strings.Join(lines, "\n")), ";")
		switch {
		case name == "" && sql != "":
			*errs = append(*errs, fmt.Errorf("%s: SQL before the first \"-- name:\" marker", file))
		case name != "" && sql == "":
			*errs = append(*errs, fmt.Errorf("%s: query %s is empty", file, name))
		case name != "":
			out[name] = sql
		}
		lines = lines[:0]
	}
	for line := range strings.Lines(body) {
		line = strings.TrimRight(line, "\r\n")
		if m := markerRE.FindStringSubmatch(line); m != nil {
			flush()
			name = m[1]
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue
		}
		lines = append(lines, line)
	}
	flush()
	return out
}

// fill sets every query field of the struct dst points to (a string field
// named as its query; a struct field holds more of them) from queries. A
// field without its query, and a query no field takes, is an error: the
// files and the Set say the same.
func fill(dst any, queries map[string]query) error {
	used := map[string]bool{}
	var errs []error
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Tag.Get("sql") == "-" {
				continue
			}
			switch f.Type.Kind() {
			case reflect.String:
				q, ok := queries[f.Name]
				if !ok {
					errs = append(errs, fmt.Errorf("query %s: no .sql file names it", f.Name))
					continue
				}
				used[f.Name] = true
				v.Field(i).SetString(q.sql)
			case reflect.Struct:
				walk(v.Field(i))
			default:
				errs = append(errs, fmt.Errorf("field %s: a query field is a string or a struct of them (or tagged sql:\"-\")", f.Name))
			}
		}
	}
	walk(reflect.ValueOf(dst).Elem())
	for _, name := range sortedKeys(queries) {
		if !used[name] {
			errs = append(errs, fmt.Errorf("%s: query %s is not used by any field", queries[name].file, name))
		}
	}
	return errors.Join(errs...)
}

// renderAll replaces the build-time templates in every query field of the
// struct dst points to: the schema's names qualified by qualify, the others
// from values.
func renderAll(dst any, qualify func(name string) string, values map[string]string) {
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		t := v.Type()
		for i := range t.NumField() {
			if t.Field(i).Tag.Get("sql") == "-" {
				continue
			}
			switch f := v.Field(i); f.Kind() {
			case reflect.String:
				sql := qualifiedRE.ReplaceAllStringFunc(f.String(), func(m string) string {
					return qualify(qualifiedRE.FindStringSubmatch(m)[1])
				})
				f.SetString(replace(sql, values))
			case reflect.Struct:
				walk(f)
			}
		}
	}
	walk(reflect.ValueOf(dst).Elem())
}

// replace substitutes the templates named in values and leaves the others.
func replace(sql string, values map[string]string) string {
	sub := func(re *regexp.Regexp) func(string) string {
		return func(m string) string {
			if v, ok := values[re.FindStringSubmatch(m)[1]]; ok {
				return v
			}
			return m
		}
	}
	sql = templateSpanRE.ReplaceAllStringFunc(sql, sub(templateSpanRE))
	return templateRE.ReplaceAllStringFunc(sql, sub(templateRE))
}

// Render fills in the call-time templates of query (a field of a [Set]) with
// values, which the caller has quoted as identifiers or literals. A template
// left without a value is an error.
func Render(query string, values map[string]string) (string, error) {
	out := replace(query, values)
	if loc := templateLeftRE.FindStringIndex(out); loc != nil {
		return "", fmt.Errorf("statements: a template has no value: %.60s", out[loc[0]:])
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
