package events

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/standmeet/events/internal/testdb"
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

var (
	fuzzPoolOnce sync.Once
	fuzzPool     *pgxpool.Pool
)
