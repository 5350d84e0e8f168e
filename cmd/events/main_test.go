package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/testdb"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// outbox is the zero Outbox: the tables on the search_path.
var outbox events.Outbox

func TestMain(m *testing.M) {
	os.Exit(testdb.Main(m, func(ctx context.Context, pool *pgxpool.Pool) error { return outbox.Migrate(ctx, pool) }))
}

// runCLI runs the command line and returns its exit code and output.
func runCLI(t *testing.T, url, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), append([]string{"--database-url", url}, args...), strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

var (
	uuidRE   = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	timeRE   = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	cursorRE = regexp.MustCompile(`--after \d+\.\d+`)
	lagRE    = regexp.MustCompile(`(?m)^lag( +)\S+$`)
	spacesRE = regexp.MustCompile(` +\n`)
)

// golden compares out, with IDs, times and durations masked, to
// testdata/name.golden.
func golden(t *testing.T, name, out string) {
	t.Helper()
	out = uuidRE.ReplaceAllString(out, "<id>")
	out = timeRE.ReplaceAllString(out, "<time>")
	out = cursorRE.ReplaceAllString(out, "--after <cursor>")
	out = lagRE.ReplaceAllString(out, "lag${1}<lag>")
	out = spacesRE.ReplaceAllString(out, "\n")
	path := filepath.Join("testdata", name+".golden")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(out), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run with -update to create it")
	require.Equal(t, string(want), out)
}

// fixture fills a fresh database: two pending events, one poisoned, one
// fanned out, a watch and a registered subscriber.
func fixture(t *testing.T) (url string, poisoned, fanned uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	url = testdb.URL(t)
	pool := testdb.Pool(t, url)
	exec := func(sql string, args ...any) {
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	exec(`INSERT INTO outbox_events (id, type, subject, payload) VALUES
		(gen_random_uuid(), 'note.changed', 'note:1', '{"title":"Plan"}'),
		(gen_random_uuid(), 'order.placed', 'order:7', '{}')`)
	poisoned, fanned = uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	exec(`INSERT INTO outbox_events (id, type, subject, payload, attempts, last_error, poisoned_at)
		VALUES ($1, 'ledger.entry', 'entry:3', '{"cents":1200}', 5, 'subscriber "ledger": Map: schema mismatch', now())`, poisoned)
	exec(`INSERT INTO outbox_events (id, type, subject, fanned_out_at, fanout) VALUES ($1, 'note.changed', 'note:2', now(), '{"search":12,"audit":13}')`, fanned)
	exec(`INSERT INTO outbox_subscribers (name) VALUES ('audit'), ('search')`)
	exec(`CREATE TABLE invoices (id int PRIMARY KEY, status text)`)
	require.NoError(t, outbox.InstallWatch(ctx, pool, events.Watch{Table: "invoices",
		Types: map[events.Op]string{events.OpUpdate: "invoice.changed", events.OpDelete: "invoice.deleted"}, SubjectPrefix: "invoice:"}))
	return url, poisoned, fanned
}

func TestTables(t *testing.T) {
	t.Parallel()
	url, poisoned, _ := fixture(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"stats", []string{"stats"}},
		{"list_pending", []string{"list", "pending", "--limit", "1"}},
		{"list_pending_notes", []string{"list", "pending", "--type", "note.*"}},
		{"list_poisoned", []string{"list", "poisoned"}},
		{"list_recent", []string{"list", "recent", "--subject", "note:2"}},
		{"inspect", []string{"inspect", poisoned.String()}},
		{"watch_list", []string{"watch", "list"}},
		{"subscribers", []string{"subscribers"}},
		{"migrate_list", []string{"migrate", "list"}},
	} {
		code, out, errOut := runCLI(t, url, "", tc.args...)
		require.Equal(t, exitOK, code, "%v: %s", tc.args, errOut)
		golden(t, tc.name, out)
	}
}

func TestJSON(t *testing.T) {
	t.Parallel()
	url, poisoned, fanned := fixture(t)
	var st map[string]any
	code, out, _ := runCLI(t, url, "", "--json", "stats")
	require.Equal(t, exitOK, code)
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.Equal(t, map[string]any{"pending": 2.0, "retrying": 0.0, "poisoned": 1.0, "catching_up": 0.0, "fanned_out_last_minute": 1.0,
		"lag_seconds": st["lag_seconds"], "owed": 0.0, "poisoned_deliveries": 0.0, "orphaned": []any{}, "paused": []any{},
		"blocked_chains": 0.0}, st)

	var page struct {
		Events []struct {
			ID        uuid.UUID `json:"id"`
			Type      string    `json:"type"`
			Attempts  int       `json:"attempts"`
			LastError string    `json:"last_error"`
		} `json:"events"`
		Next string `json:"next"`
	}
	code, out, _ = runCLI(t, url, "", "--json", "list", "poisoned")
	require.Equal(t, exitOK, code)
	require.NoError(t, json.Unmarshal([]byte(out), &page))
	require.Len(t, page.Events, 1)
	require.Equal(t, poisoned, page.Events[0].ID)
	require.Equal(t, 5, page.Events[0].Attempts)
	require.Empty(t, page.Next)

	var one struct {
		Fanout map[string]int64 `json:"fanout"`
	}
	code, out, _ = runCLI(t, url, "", "--json", "inspect", fanned.String())
	require.Equal(t, exitOK, code)
	require.NoError(t, json.Unmarshal([]byte(out), &one))
	require.Equal(t, map[string]int64{"search": 12, "audit": 13}, one.Fanout)
}

func TestRequeueAndDiscard(t *testing.T) {
	t.Parallel()
	url, poisoned, fanned := fixture(t)
	// Not confirmed: nothing changes.
	code, _, errOut := runCLI(t, url, "n\n", "requeue", "--all-poisoned", "--type", "ledger.**")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "requeue 0 poisoned deliveries of type ledger.** and 1 event(s) poisoned as a whole? [y/N]")
	require.Contains(t, errOut, "not confirmed")
	code, out, _ := runCLI(t, url, "", "--json", "list", "poisoned")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, poisoned.String())

	// Confirmed on stdin.
	code, out, errOut = runCLI(t, url, "y\n", "requeue", "--all-poisoned", "--type", "ledger.**")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "requeued  1  of type ledger.**\n", out)
	code, out, _ = runCLI(t, url, "", "--json", "list", "pending")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, poisoned.String(), "requeued events are pending again")

	// Discard refuses what is not poisoned, and an unknown ID: exit 1.
	code, _, errOut = runCLI(t, url, "", "discard", "--event", fanned.String())
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "not poisoned")
	code, _, errOut = runCLI(t, url, "", "requeue", "--event", uuid.Must(uuid.NewV7()).String())
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "not found")
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	url := testdb.EmptyURL(t)
	code, out, _ := runCLI(t, url, "", "migrate", "--dry-run")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "-- events 001 outbox_events")
	require.Contains(t, out, "CREATE TABLE outbox_events")
	require.Contains(t, out, "-- river 001")
	code, out, _ = runCLI(t, url, "", "migrate")
	require.Equal(t, exitOK, code)
	require.Equal(t, "migrated\n", out)
	code, out, _ = runCLI(t, url, "", "migrate", "--dry-run")
	require.Equal(t, exitOK, code)
	require.Equal(t, "-- nothing to apply\n", out)
}

func TestUsageErrorsExitTwo(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"--bogus", "stats"},
		{"list"},
		{"list", "sideways"},
		{"list", "pending", "--limit", "x"},
		{"list", "pending", "--type", "a*"},
		{"inspect", "not-an-id"},
		{"requeue"},
		{"requeue", "--type", "a"},
		{"requeue", uuid.Must(uuid.NewV7()).String()},
		{"requeue", "--event", "not-an-id"},
		{"requeue", "--all-poisoned", "--event", uuid.Must(uuid.NewV7()).String()},
		{"requeue", "--all-poisoned", "--type", "a*"},
		{"requeue", "--event", uuid.Must(uuid.NewV7()).String(), "--type", "a*"},
		{"discard", "--yes", "--event", uuid.Must(uuid.NewV7()).String()},
		{"watch", "add"},
	} {
		code, out, errOut := runCLI(t, url, "", args...)
		require.Equal(t, exitUsage, code, "%v: %s", args, errOut)
		require.Empty(t, out, "%v", args)
		require.Contains(t, errOut, "usage: events", "%v", args)
	}
	var out, errOut bytes.Buffer
	require.Equal(t, exitUsage, run(context.Background(), []string{"stats"}, strings.NewReader(""), &out, &errOut), "no database")
	require.Equal(t, exitOK, run(context.Background(), []string{"--help"}, strings.NewReader(""), &out, &errOut))
	// An unknown event: a plain error, exit 1.
	code, _, stderr := runCLI(t, url, "", "inspect", uuid.Must(uuid.NewV7()).String())
	require.Equal(t, exitError, code)
	require.Contains(t, stderr, "event not found")
}

// hostile records an event whose subject, last error and payload hold bytes
// that drive a terminal (an OSC retitle ended by BEL, a clear screen, a
// colour, a C1 CSI, a bidi override) and a last error long enough in
// multi-byte text to be cut.
func hostile(t *testing.T) (url string, id uuid.UUID, subject, lastError string) {
	t.Helper()
	url = testdb.URL(t)
	pool := testdb.Pool(t, url)
	id = uuid.Must(uuid.NewV7())
	subject = "note:\x1b]0;owned\a\x1b[2J"
	lastError = "subscriber \"search\": Map: \x1b[31m" + strings.Repeat("ошибка ", 12) + "\u009b"
	_, err := pool.Exec(context.Background(), `INSERT INTO outbox_events (id, type, subject, payload, attempts, last_error)
		VALUES ($1, 'note.changed', $2, $3, 1, $4)`, id, subject, `{"title":"\u202eevil\u0085", "bell":"\u0007"}`, lastError)
	require.NoError(t, err)
	return url, id, subject, lastError
}

func TestHostileBytesAreEscapedInTables(t *testing.T) {
	t.Parallel()
	url, id, subject, lastError := hostile(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"list_hostile", []string{"list", "retrying"}},
		{"inspect_hostile", []string{"inspect", id.String()}},
	} {
		code, out, errOut := runCLI(t, url, "", tc.args...)
		require.Equal(t, exitOK, code, "%v: %s", tc.args, errOut)
		for _, b := range []string{"\x1b", "\a", "\u009b", "\u202e", "\u0085"} {
			require.NotContains(t, out, b, "%v: a control character reached the terminal", tc.args)
		}
		require.True(t, utf8.ValidString(out), "%v: a rune was cut", tc.args)
		golden(t, tc.name, out)
	}

	// JSON keeps the bytes exactly.
	var page struct {
		Events []struct {
			Subject   string          `json:"subject"`
			LastError string          `json:"last_error"`
			Payload   json.RawMessage `json:"payload"`
		} `json:"events"`
	}
	code, out, _ := runCLI(t, url, "", "--json", "list", "retrying")
	require.Equal(t, exitOK, code)
	require.NoError(t, json.Unmarshal([]byte(out), &page))
	require.Len(t, page.Events, 1)
	require.Equal(t, subject, page.Events[0].Subject)
	require.Equal(t, lastError, page.Events[0].LastError)
	var payload map[string]string
	require.NoError(t, json.Unmarshal(page.Events[0].Payload, &payload))
	require.Equal(t, map[string]string{"title": "\u202eevil\u0085", "bell": "\a"}, payload)
}

func TestErrorsArePrefixedOnce(t *testing.T) {
	t.Parallel()
	// A database without the library's tables: the library's own error.
	code, _, errOut := runCLI(t, testdb.EmptyURL(t), "", "stats")
	require.Equal(t, exitError, code)
	require.True(t, strings.HasPrefix(errOut, "events: stats: "), errOut)
	require.NotContains(t, errOut, "events: events:")

	url := testdb.URL(t)
	id := uuid.Must(uuid.NewV7())
	code, _, errOut = runCLI(t, url, "", "inspect", id.String())
	require.Equal(t, exitError, code)
	require.Equal(t, "events: event not found: "+id.String()+"\n", errOut)
	code, _, errOut = runCLI(t, url, "", "discard", "--event", id.String())
	require.Equal(t, exitError, code)
	require.Equal(t, "events: event not found: "+id.String()+"\nevents: 1 of 1 event(s) not discarded\n", errOut)
	// A usage error: one prefix too.
	code, _, errOut = runCLI(t, url, "", "list", "sideways")
	require.Equal(t, exitUsage, code)
	require.True(t, strings.HasPrefix(errOut, "events: list: state "), errOut)
}

// watchCLI runs "stats --watch" for frames frames: the third time the watch
// would wait, the test interrupts it instead, as Ctrl-C would.
func watchCLI(t *testing.T, url string, frames int, args ...string) (code int, out string, waits []time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr bytes.Buffer
	c := &cli{ctx: ctx, stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr,
		after: func(d time.Duration) <-chan time.Time {
			waits = append(waits, d)
			if len(waits) == frames {
				cancel()
				return nil // never fires: only the interrupt ends the wait
			}
			tick := make(chan time.Time, 1)
			tick <- time.Now()
			return tick
		}}
	code = c.exit(append([]string{"--database-url", url}, args...))
	require.Empty(t, stderr.String())
	return code, stdout.String(), waits
}

func TestStatsWatchRepeatsUntilInterrupted(t *testing.T) {
	t.Parallel()
	url, _, _ := fixture(t)
	code, out, waits := watchCLI(t, url, 3, "stats", "--watch", "2")
	require.Equal(t, exitOK, code, "an interrupt ends a watch without an error")
	require.Equal(t, []time.Duration{2 * time.Second, 2 * time.Second, 2 * time.Second}, waits)
	require.Equal(t, 3, strings.Count(out, "\npoisoned  "), out)
	golden(t, "stats_watch", out)

	code, out, _ = watchCLI(t, url, 2, "--json", "stats", "--watch", "0.5")
	require.Equal(t, exitOK, code)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 2, "one JSON object per line")
	for _, l := range lines {
		var st map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &st))
		require.Equal(t, float64(1), st["poisoned"])
	}

	for _, bad := range []string{"0.01", "-1", "x"} {
		code, _, errOut := runCLI(t, url, "", "stats", "--watch", bad)
		require.Equal(t, exitUsage, code, bad)
		require.Contains(t, errOut, "usage: events", bad)
	}
}
