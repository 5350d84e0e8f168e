package events

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/standmeet/events/internal/statements"
)

// A watch's own trigger functions. The generic outbox_watch() reads its
// spec from the trigger's arguments on every row and turns the whole row into
// JSON to read the subject column; under 32 concurrent writers that made a
// watched table's writes 0.72x as fast as a plain INSERT beside them, and a
// function written for the table, with its constants and columns spelled
// out, 0.83-0.95x (docs/benchmarks.md). So InstallWatch writes one function
// per trigger, in the outbox's schema, named after the trigger's generic
// definition (outbox_watch_ and 16 hex digits), making the same rows as the
// generic function does.
//
// The trigger keeps the generic definition's arguments and fingerprint: an
// older release's ListWatches reads the spec from the arguments, and its
// InstallWatch, finding its own fingerprint, leaves the trigger alone during a
// rolling deploy instead of putting the generic one back. A role that may not
// create functions in the outbox's schema gets the generic function, as
// before.

// watchFunctionPrefix starts the name of every watch's own trigger function.
const watchFunctionPrefix = "outbox_watch_"

// watchTrigger is one trigger of a watch calling its own function (the
// fingerprint hashes the generic definition, calling outbox_watch).
type watchTrigger struct {
	own      string // CREATE TRIGGER … EXECUTE FUNCTION function(args)
	function string // the watch's own function's name, unqualified
	create   string // CREATE OR REPLACE FUNCTION of it
}

// watchFunctionName names the function of the trigger whose generic
// definition is generic.
func watchFunctionName(generic string) string {
	sum := sha256.Sum256([]byte(generic))
	return watchFunctionPrefix + hex.EncodeToString(sum[:8])
}

// functionDDL returns the CREATE OR REPLACE FUNCTION of the trigger function
// for op of w, named name in schema, recording what outbox_watch would with
// the same arguments.
func (w *Watch) functionDDL(sql *statements.Set, schema, name string, op Op, subjectCol string) (string, error) {
	row := "NEW"
	if op == OpDelete {
		row = "OLD"
	}
	column := func(c string) string { return "to_jsonb(" + row + "." + pgx.Identifier{c}.Sanitize() + ")" }
	// rec ->> col in outbox_watch: the column's JSON text, '' for NULL.
	text := func(prefix, col string) string {
		if col == "" {
			return statements.Literal(prefix)
		}
		return statements.Literal(prefix) + " || coalesce(" + column(col) + " #>> '{}', '')"
	}
	var payload string
	switch w.Payload {
	case PayloadRow:
		payload = "to_jsonb(" + row + ")"
	case PayloadOldNew:
		oldRow, newRow := "to_jsonb(OLD)", "to_jsonb(NEW)"
		switch op {
		case OpInsert:
			oldRow = "NULL::jsonb"
		case OpDelete:
			newRow = "NULL::jsonb"
		}
		payload = "jsonb_build_object('old', " + oldRow + ", 'new', " + newRow + ")"
	case PayloadColumns:
		// jsonb_build_object takes at most 100 arguments: 50 columns a call.
		var parts []string
		for start := 0; start < len(w.PayloadColumns); start += 50 {
			var pairs []string
			for _, c := range w.PayloadColumns[start:min(start+50, len(w.PayloadColumns))] {
				pairs = append(pairs, statements.Literal(c)+", "+column(c))
			}
			parts = append(parts, "jsonb_build_object("+strings.Join(pairs, ", ")+")")
		}
		payload = strings.Join(parts, " || ")
	default:
		payload = "'{}'::jsonb"
	}
	values := map[string]string{
		"function": pgx.Identifier{schema, name}.Sanitize(), "schema_name": pgx.Identifier{schema}.Sanitize(),
		"type": statements.Literal(w.Types[op]), "subject": text(w.SubjectPrefix, subjectCol), "payload": payload,
		"scope": text(w.ScopePrefix, w.ScopeColumn),
	}
	tag := "$" + name + "$"
	for _, v := range values {
		if strings.Contains(v, tag) {
			return "", fmt.Errorf("events: install watch: a name of the watch holds %s", tag)
		}
	}
	values["tag"] = tag
	return statements.Render(sql.CreateWatchFunction, values)
}
