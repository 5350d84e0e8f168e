package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/testdb"
)

// Hostile bytes of the per-subscriber fixture: a relay's host, a
// subscriber's name, a subject and an attempt's error, each with bytes
// that drive a terminal; the error long in multi-byte text, to be cut.
const (
	hostileHost    = "web-1\x1b]0;owned\a"
	hostileName    = "evil\x1b[2J"
	hostileSubject = "note:\x1b[31m9\u202e"
)

var hostileError = "subscriber \"mail\": Map: \x1b[31m" + strings.Repeat("ошибка ", 12) + "\u009b"

// pairsFixture fills a fresh database with per-subscriber state: relays
// running, stopped and dead; subscribers active with owed pairs, paused
// with a poisoned pair (and its error history), orphaned, retired, and one
// with a hostile name; two events with pairs.
func pairsFixture(t *testing.T) (url string, poisoned, owed uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	url = testdb.URL(t)
	pool := testdb.Pool(t, url)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	exec(`INSERT INTO outbox_relays (id, host, pid, version, subscribers, started_at, last_seen_at, stopped_at, listening, poll_only, consecutive_failures, last_round_at) VALUES
		(gen_random_uuid(), 'web-0', 11, 'v0.1.0', '{search}', now() - interval '3 hours', now() - interval '2 hours', now() - interval '2 hours', false, false, 0, NULL),
		(gen_random_uuid(), $1, 42, 'v0.2.0', $2, now() - interval '1 hour', now(), NULL, true, false, 0, now()),
		(gen_random_uuid(), 'worker-7', 7, 'v0.2.0', '{search}', now() - interval '50 minutes', now() - interval '10 minutes', NULL, false, true, 3, now() - interval '11 minutes')`,
		hostileHost, []string{"search", "mail", hostileName})
	exec(`INSERT INTO outbox_subscribers (name, registered_at, retired_at, types, last_served_at, paused_at, backfill_since, backfill_seq, backfill_done_at) VALUES
		('search', now() - interval '1 day', NULL, '{note.*,order.**}', now(), NULL, now() - interval '2 days', 2, now()),
		('mail', now() - interval '1 day', NULL, '{note.changed}', now(), now(), NULL, NULL, NULL),
		('ghost', now() - interval '1 day', NULL, '{ledger.*}', now() - interval '1 hour', NULL, NULL, NULL, NULL),
		('old', now() - interval '2 days', now() - interval '1 day', '{note.*}', now() - interval '1 day', NULL, NULL, NULL, NULL),
		($1, now() - interval '1 day', NULL, '{}', now(), NULL, NULL, NULL, NULL)`, hostileName)
	poisoned, owed = uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	exec(`INSERT INTO outbox_events (id, type, subject, fanned_out_at, fanout) VALUES
		($1, 'note.changed', $3, now(), '{"audit": 21}'), ($2, 'order.placed', 'order:7', now(), '{}')`, poisoned, owed, hostileSubject)
	exec(`INSERT INTO outbox_deliveries (event_seq, subscriber, attempts, next_attempt_at, poisoned_at, last_error, errors, created_at)
		SELECT seq, 'mail', 5, now(), now(), $2,
		       jsonb_build_array(jsonb_build_object('at', now() - interval '1 minute', 'error', 'subscriber "mail": Map: smtp down'),
		                         jsonb_build_object('at', now(), 'error', $2::text)),
		       now() - interval '30 minutes'
		  FROM outbox_events WHERE id = $1`, poisoned, hostileError)
	exec(`INSERT INTO outbox_deliveries (event_seq, subscriber, attempts, next_attempt_at, created_at)
		SELECT seq, 'search', 0, now(), now() - interval '2 hours' FROM outbox_events WHERE id = $1`, owed)
	exec(`INSERT INTO outbox_deliveries (event_seq, subscriber, attempts, next_attempt_at, created_at)
		SELECT seq, 'search', 1, now() + interval '1 minute', now() - interval '30 minutes' FROM outbox_events WHERE id = $1`, poisoned)
	return url, poisoned, owed
}

func TestPairTables(t *testing.T) {
	t.Parallel()
	url, poisoned, _ := pairsFixture(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"pairs_subscribers", []string{"subscribers"}},
		{"pairs_stats", []string{"stats"}},
		{"pairs_relays", []string{"relays"}},
		{"pairs_deliveries", []string{"deliveries"}},
		{"pairs_deliveries_owed", []string{"deliveries", "owed", "--subscriber", "search", "--type", "order.*"}},
		{"pairs_inspect", []string{"inspect", poisoned.String()}},
	} {
		code, out, errOut := runCLI(t, url, "", tc.args...)
		require.Equal(t, exitOK, code, "%v: %s", tc.args, errOut)
		for _, b := range []string{"\x1b", "\a", "\u009b", "\u202e"} {
			require.NotContains(t, out, b, "%v: a control character reached the terminal", tc.args)
		}
		require.True(t, utf8.ValidString(out), "%v: a rune was cut", tc.args)
		golden(t, tc.name, out)
	}
}

func TestPairJSON(t *testing.T) {
	t.Parallel()
	url, poisoned, owed := pairsFixture(t)

	var subs []struct {
		Name            string     `json:"name"`
		Types           []string   `json:"types"`
		Orphaned        bool       `json:"orphaned"`
		PausedAt        *time.Time `json:"paused_at"`
		RetiredAt       *time.Time `json:"retired_at"`
		Owed, Poisoned  int64
		OldestOwedSince *time.Time `json:"oldest_owed_since"`
		LastServedBy    *uuid.UUID `json:"last_served_by"`
		Backfill        *struct {
			Seq    int64      `json:"seq"`
			DoneAt *time.Time `json:"done_at"`
		} `json:"backfill"`
	}
	code, out, errOut := runCLI(t, url, "", "--json", "subscribers")
	require.Equal(t, exitOK, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &subs))
	byName := map[string]int{}
	for i, s := range subs {
		byName[s.Name] = i
	}
	require.Len(t, subs, 5)
	search, mail, ghost, old, evil := subs[byName["search"]], subs[byName["mail"]], subs[byName["ghost"]], subs[byName["old"]], subs[byName[hostileName]]
	require.Equal(t, []string{"note.*", "order.**"}, search.Types)
	require.Equal(t, int64(2), search.Owed)
	require.WithinDuration(t, time.Now().Add(-2*time.Hour), *search.OldestOwedSince, time.Minute)
	require.NotNil(t, search.Backfill)
	require.Equal(t, int64(2), search.Backfill.Seq)
	require.NotNil(t, search.Backfill.DoneAt)
	require.Equal(t, int64(1), mail.Poisoned)
	require.NotNil(t, mail.PausedAt)
	require.True(t, ghost.Orphaned)
	require.Nil(t, ghost.LastServedBy, "no relay of the last day has ghost")
	require.False(t, search.Orphaned || mail.Orphaned || old.Orphaned || evil.Orphaned)
	require.NotNil(t, old.RetiredAt)
	require.NotNil(t, evil.LastServedBy)
	require.Equal(t, *evil.LastServedBy, *mail.LastServedBy)
	require.Equal(t, *search.LastServedBy, *mail.LastServedBy, "search is named with the relay seen last, not the dead or the stopped one")

	var st struct {
		Owed               int64 `json:"owed"`
		PoisonedDeliveries int64 `json:"poisoned_deliveries"`
		Orphaned, Paused   []string
	}
	code, out, errOut = runCLI(t, url, "", "--json", "stats")
	require.Equal(t, exitOK, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.Equal(t, int64(2), st.Owed)
	require.Equal(t, int64(1), st.PoisonedDeliveries)
	require.Equal(t, []string{"ghost"}, st.Orphaned)
	require.Equal(t, []string{"mail"}, st.Paused)
	code, out, errOut = runCLI(t, url, "", "--json", "stats", "--orphan-after", "2h")
	require.Equal(t, exitOK, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.Empty(t, st.Orphaned, "ghost was served an hour ago")

	var relays []struct {
		Host        string   `json:"host"`
		State       string   `json:"state"`
		Subscribers []string `json:"subscribers"`
		PollOnly    bool     `json:"poll_only"`
		Failures    int      `json:"consecutive_failures"`
	}
	code, out, errOut = runCLI(t, url, "", "--json", "relays")
	require.Equal(t, exitOK, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &relays))
	require.Len(t, relays, 3)
	require.Equal(t, []string{"stopped", "running", "dead"}, []string{relays[0].State, relays[1].State, relays[2].State})
	require.Equal(t, hostileHost, relays[1].Host, "JSON keeps the bytes exactly")
	require.Equal(t, []string{"search", "mail", hostileName}, relays[1].Subscribers)
	require.True(t, relays[2].PollOnly)
	require.Equal(t, 3, relays[2].Failures)

	var page struct {
		Deliveries []struct {
			EventID    uuid.UUID             `json:"event_id"`
			Subject    string                `json:"subject"`
			Subscriber string                `json:"subscriber"`
			LastError  string                `json:"last_error"`
			Errors     []events.AttemptError `json:"errors"`
			PoisonedAt *time.Time            `json:"poisoned_at"`
		} `json:"deliveries"`
	}
	code, out, errOut = runCLI(t, url, "", "--json", "deliveries", "poisoned")
	require.Equal(t, exitOK, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &page))
	require.Len(t, page.Deliveries, 1)
	d := page.Deliveries[0]
	require.Equal(t, poisoned, d.EventID)
	require.Equal(t, "mail", d.Subscriber)
	require.Equal(t, hostileSubject, d.Subject)
	require.Equal(t, hostileError, d.LastError)
	require.Len(t, d.Errors, 2)
	require.Equal(t, hostileError, d.Errors[1].Error)
	require.NotNil(t, d.PoisonedAt)

	code, out, errOut = runCLI(t, url, "", "--json", "deliveries", "owed", "--subscriber", "search")
	require.Equal(t, exitOK, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &page))
	require.Len(t, page.Deliveries, 2)
	require.Equal(t, []uuid.UUID{poisoned, owed}, []uuid.UUID{page.Deliveries[0].EventID, page.Deliveries[1].EventID})

	var one struct {
		Deliveries []struct {
			Subscriber string                `json:"subscriber"`
			Errors     []events.AttemptError `json:"errors"`
		} `json:"deliveries"`
	}
	code, out, errOut = runCLI(t, url, "", "--json", "inspect", poisoned.String())
	require.Equal(t, exitOK, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &one))
	require.Len(t, one.Deliveries, 2)
	require.Equal(t, "mail", one.Deliveries[0].Subscriber)
	require.Len(t, one.Deliveries[0].Errors, 2)
}

func TestPairActions(t *testing.T) {
	t.Parallel()
	url, poisoned, owed := pairsFixture(t)
	pool := testdb.Pool(t, url)
	ctx := context.Background()
	pair := func(id uuid.UUID, subscriber string) (exists, isPoisoned bool) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) > 0, coalesce(bool_or(d.poisoned_at IS NOT NULL), false)
			FROM outbox_deliveries d JOIN outbox_events e ON e.seq = d.event_seq WHERE e.id = $1 AND d.subscriber = $2`,
			id, subscriber).Scan(&exists, &isPoisoned))
		return exists, isPoisoned
	}

	// A pair not poisoned: refused, exit 1, nothing changed.
	code, _, errOut := runCLI(t, url, "", "requeue", "--event", owed.String(), "--subscriber", "search")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "not poisoned")
	code, _, errOut = runCLI(t, url, "", "discard", "--subscriber", "ghost", "--event", poisoned.String())
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "not found")

	// Requeue one pair: that pair alone, the other subscriber's untouched.
	code, out, errOut := runCLI(t, url, "", "requeue", "--event", poisoned.String(), "--subscriber", "mail")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "requeued  "+poisoned.String()+"  for mail\n", out)
	exists, isPoisoned := pair(poisoned, "mail")
	require.True(t, exists)
	require.False(t, isPoisoned)
	exists, _ = pair(poisoned, "search")
	require.True(t, exists)

	// Poisoned again; discard the pair (JSON): the event row and search's
	// pair stay.
	_, err := pool.Exec(ctx, `UPDATE outbox_deliveries SET poisoned_at = now() WHERE subscriber = 'mail'`)
	require.NoError(t, err)
	code, out, errOut = runCLI(t, url, "", "--json", "discard", "--event", poisoned.String(), "--subscriber", "mail")
	require.Equal(t, exitOK, code, errOut)
	var res struct {
		Discarded  []uuid.UUID `json:"discarded"`
		Subscriber string      `json:"subscriber"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, []uuid.UUID{poisoned}, res.Discarded)
	require.Equal(t, "mail", res.Subscriber)
	exists, _ = pair(poisoned, "mail")
	require.False(t, exists)
	exists, _ = pair(poisoned, "search")
	require.True(t, exists)
	code, _, _ = runCLI(t, url, "", "inspect", poisoned.String())
	require.Equal(t, exitOK, code, "the event row stays")

	// Pause and resume.
	code, out, errOut = runCLI(t, url, "", "pause", "search")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "paused  search\n", out)
	var paused bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT paused_at IS NOT NULL FROM outbox_subscribers WHERE name = 'search'`).Scan(&paused))
	require.True(t, paused)
	code, out, errOut = runCLI(t, url, "", "--json", "resume", "search")
	require.Equal(t, exitOK, code, errOut)
	require.JSONEq(t, `{"resumed": "search"}`, out)
	require.NoError(t, pool.QueryRow(ctx, `SELECT paused_at IS NOT NULL FROM outbox_subscribers WHERE name = 'search'`).Scan(&paused))
	require.False(t, paused)
	code, _, errOut = runCLI(t, url, "", "pause", "nobody")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "unknown subscriber")

	for _, args := range [][]string{
		{"pause"}, {"resume", "a", "b"},
		{"deliveries", "sideways"}, {"deliveries", "owed", "poisoned"}, {"deliveries", "--type", "a*"},
		{"requeue", "--subscriber", "mail"}, {"requeue", "--subscriber", "mail", "--type", "note.*", poisoned.String()},
		{"requeue", "--all-poisoned", "--subscriber", "mail", poisoned.String()},
		{"requeue", "--all-poisoned", "--subscriber", "mail", "--event", poisoned.String()},
		{"discard", "--subscriber", "mail"}, {"relays", "x"}, {"subscribers", "x"},
	} {
		code, out, errOut := runCLI(t, url, "", args...)
		require.Equal(t, exitUsage, code, "%v: %s", args, errOut)
		require.Empty(t, out, "%v", args)
	}
}

func TestRequeueAllPoisonedOfOneSubscriber(t *testing.T) {
	t.Parallel()
	url, _, _ := pairsFixture(t)
	pool := testdb.Pool(t, url)
	ctx := context.Background()
	// search's pair of the same event poisoned too: only mail's is requeued.
	_, err := pool.Exec(ctx, `UPDATE outbox_deliveries SET poisoned_at = now() WHERE subscriber = 'search'`)
	require.NoError(t, err)
	countPoisoned := func(subscriber string) (n int) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_deliveries WHERE subscriber = $1 AND poisoned_at IS NOT NULL`,
			subscriber).Scan(&n))
		return n
	}
	code, _, errOut := runCLI(t, url, "n\n", "requeue", "--all-poisoned", "--subscriber", "mail")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "requeue 1 poisoned deliveries for mail? [y/N]")
	require.Contains(t, errOut, "not confirmed")
	require.Equal(t, 1, countPoisoned("mail"))

	code, out, errOut := runCLI(t, url, "y\n", "requeue", "--all-poisoned", "--subscriber", "mail", "--type", "note.*")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "requeued  1  for mail of type note.*\n", out)
	require.Zero(t, countPoisoned("mail"))
	require.Equal(t, 2, countPoisoned("search"), "another subscriber's pairs stay poisoned")

	code, out, errOut = runCLI(t, url, "", "--json", "requeue", "--all-poisoned", "--subscriber", "mail")
	require.Equal(t, exitOK, code, errOut)
	require.JSONEq(t, `{"requeued_count": 0, "subscriber": "mail", "type": ""}`, out, "nothing left, nothing asked")

	// Discard in bulk: the same filter, --yes instead of the question.
	code, out, errOut = runCLI(t, url, "", "discard", "--all-poisoned", "--subscriber", "search", "--yes")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "discarded  2  for search\n", out)
	require.Zero(t, countPoisoned("search"))
}

// The event-level forms act on every poisoned delivery of the event.
func TestEventRequeueTakesEveryPoisonedPair(t *testing.T) {
	t.Parallel()
	url, poisoned, _ := pairsFixture(t)
	pool := testdb.Pool(t, url)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `UPDATE outbox_deliveries SET poisoned_at = now() WHERE subscriber = 'search'`)
	require.NoError(t, err)
	code, out, errOut := runCLI(t, url, "", "requeue", "--event", poisoned.String())
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "requeued  "+poisoned.String()+"\n", out)
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_deliveries d JOIN outbox_events e ON e.seq = d.event_seq
		WHERE e.id = $1 AND d.poisoned_at IS NOT NULL`, poisoned).Scan(&left))
	require.Zero(t, left)
}
