package events

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/standmeet/events/internal/glob"
	"github.com/standmeet/events/internal/testdb"
)

var (
	fuzzPoolOnce sync.Once
	fuzzPool     *pgxpool.Pool
)

// FuzzValidate checks that Validate never panics, and that whatever it accepts
// PostgreSQL accepts too: an accepted event must never abort the host's
// transaction. The seed corpus runs with the ordinary tests; fuzz with
//
//	go test -run '^$' -fuzz FuzzValidate .
func FuzzValidate(f *testing.F) {
	for _, seed := range []struct{ typ, subject, payload string }{
		{"note.changed", "note:1", `{"a":1}`},
		{"a", "", ""},
		{"a..b", "x", "{}"},
		{"a.b", "\x00", `"\u0000"`},
		{"a.b", "é", `["\ud800"]`},
		{"a.b", "s", `["\ud83d\ude00", "\\u0000"]`},
		{"a.b", "s", `{"a":"\udc00"}`},
		{"a.b", "s", "\xff"},
		{"a.b", "s", `[1e400, -0, 1E-400]`},
		{"a.b", "s", `{"":null,"x":[true,false,{}]}`},
		{"a.b", "s", `[1e131071, 1e131072, 1e-16383, 1e-16384, 0.1e-16383, 0e1000000, -12.5E+3]`},
		{"a.b", "s", `{"n":123456e131066}`},
	} {
		f.Add(seed.typ, seed.subject, []byte(seed.payload))
	}
	f.Fuzz(func(t *testing.T, typ, subject string, payload []byte) {
		e := Event{Type: typ, Subject: subject, Payload: payload}
		if err := Validate(e); err != nil {
			return
		}
		if !utf8.ValidString(subject) || strings.ContainsRune(subject, 0) {
			t.Fatalf("accepted a subject PostgreSQL text cannot hold: %q", subject)
		}
		if len(payload) > 0 && !json.Valid(payload) {
			t.Fatalf("accepted invalid JSON: %q", payload)
		}
		fuzzPoolOnce.Do(func() {
			// Shared by every input, so it outlives the first one's t.
			url, _, err := testdb.NewDatabase()
			if err == nil {
				fuzzPool, err = pgxpool.New(context.Background(), url)
			}
			if err != nil {
				t.Fatal(err)
			}
			testdb.AtExit(fuzzPool.Close)
		})
		p := string(payload)
		if p == "" {
			p = "{}"
		}
		var ok bool
		if err := fuzzPool.QueryRow(context.Background(),
			"SELECT $1::text::jsonb IS NOT NULL AND $2::text ~ '^[A-Za-z0-9_-]+(\\.[A-Za-z0-9_-]+)*$'", p, typ).Scan(&ok); err != nil || !ok {
			t.Fatalf("Validate accepted type %q payload %q, PostgreSQL refuses it: %v", typ, payload, err)
		}
	})
}

// FuzzGlobMatch checks that pattern compilation never panics and that
// matching agrees with a few laws: a literal pattern matches exactly itself,
// "**" matches every type, and "*" stands for exactly one segment.
func FuzzGlobMatch(f *testing.F) {
	for _, seed := range [][2]string{
		{"corpus.note.*", "corpus.note.changed"},
		{"supplier.**", "supplier"},
		{"**.deleted", "a.b.deleted"},
		{"a.**.z", "a.z"},
		{"*", "a.b"},
		{"a..b", "a.b"},
		{"note*", "note"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, pattern, typ string) {
		p, err := glob.Compile(pattern)
		if ValidateType(typ) != nil {
			return
		}
		all, _ := glob.Compile("**")
		if !all.Match(typ) {
			t.Fatalf("** does not match %q", typ)
		}
		lit, err2 := glob.Compile(typ)
		if err2 != nil || !lit.Match(typ) {
			t.Fatalf("the literal pattern %q does not match itself: %v", typ, err2)
		}
		if err != nil {
			return
		}
		matched := p.Match(typ)
		if !strings.Contains(pattern, "*") && matched != (pattern == typ) {
			t.Fatalf("literal pattern %q vs %q: match %v", pattern, typ, matched)
		}
		one, _ := glob.Compile(strings.Repeat("*.", strings.Count(typ, ".")) + "*")
		if !one.Match(typ) {
			t.Fatalf("one * per segment does not match %q", typ)
		}
	})
}
