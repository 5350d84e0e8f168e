package eventsui_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/eventstest"
	"github.com/standmeet/events/eventsui"
)

// Hostile data of the per-subscriber fixture: a relay's host, a
// subscriber's name (with a slash, for the action paths) and an attempt's
// error, each with markup.
const (
	evilHost  = `web-1<script>alert(1)</script>`
	evilName  = `evil/<b>x</b>`
	evilError = `subscriber "mail": Map: <img src=x onerror=alert(1)>`
)

// pairs fills a database with per-subscriber state: relays running,
// stopped and dead; subscribers active with owed pairs (search), paused
// with a poisoned pair and its error history (mail), orphaned (ghost),
// retired (old), and a hostile one; an event fanned out to audit, poisoned
// for mail and owed to search, one owed to search alone, and one poisoned
// as a whole.
func pairs(t *testing.T) (pool *pgxpool.Pool, poisoned, owed, whole uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	pool = eventstest.Pool(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	exec(`INSERT INTO outbox_relays (id, host, pid, version, subscribers, started_at, last_seen_at, stopped_at, listening, poll_only, consecutive_failures, last_round_at) VALUES
		(gen_random_uuid(), 'web-0', 11, 'v0.1.0', '{search}', now() - interval '3 hours', now() - interval '2 hours', now() - interval '2 hours', false, false, 0, NULL),
		(gen_random_uuid(), $1, 42, 'v0.2.0', $2, now() - interval '1 hour', now(), NULL, true, false, 0, now()),
		(gen_random_uuid(), 'worker-7', 7, 'v0.2.0', '{search}', now() - interval '50 minutes', now() - interval '10 minutes', NULL, false, true, 3, now() - interval '11 minutes')`,
		evilHost, []string{"audit", "search", "mail", evilName})
	exec(`INSERT INTO outbox_subscribers (name, registered_at, retired_at, types, last_served_at, paused_at, backfill_since, backfill_seq, backfill_done_at) VALUES
		('audit', now() - interval '1 day', NULL, '{note.*}', now(), NULL, NULL, NULL, NULL),
		('search', now() - interval '1 day', NULL, '{note.*,order.**}', now(), NULL, now() - interval '2 days', 2, NULL),
		('mail', now() - interval '1 day', NULL, '{note.changed}', now(), now(), NULL, NULL, NULL),
		('ghost', now() - interval '1 day', NULL, '{ledger.*}', now() - interval '1 hour', NULL, NULL, NULL, NULL),
		('old', now() - interval '2 days', now() - interval '1 day', '{note.*}', now() - interval '1 day', NULL, NULL, NULL, NULL),
		($1, now() - interval '1 day', NULL, '{}', now(), NULL, NULL, NULL, NULL)`, evilName)
	poisoned, owed, whole = uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	exec(`INSERT INTO outbox_events (id, type, subject, fanned_out_at, fanout) VALUES
		($1, 'note.changed', 'note:1', now(), '{"audit": 21}'), ($2, 'order.placed', 'order:7', now(), '{}')`, poisoned, owed)
	exec(`INSERT INTO outbox_events (id, type, subject, attempts, last_error, poisoned_at) VALUES ($1, 'ledger.entry', 'entry:3', 5, 'no route', now())`, whole)
	exec(`INSERT INTO outbox_deliveries (event_seq, subscriber, attempts, next_attempt_at, poisoned_at, last_error, errors, created_at)
		SELECT seq, 'mail', 5, now(), now(), $2,
		       jsonb_build_array(jsonb_build_object('at', now() - interval '1 minute', 'error', 'subscriber "mail": Map: smtp down'),
		                         jsonb_build_object('at', now(), 'error', $2::text)),
		       now() - interval '30 minutes'
		  FROM outbox_events WHERE id = $1`, poisoned, evilError)
	exec(`INSERT INTO outbox_deliveries (event_seq, subscriber, attempts, next_attempt_at, created_at)
		SELECT seq, 'search', 0, now(), now() - interval '2 hours' FROM outbox_events WHERE id = $1`, owed)
	exec(`INSERT INTO outbox_deliveries (event_seq, subscriber, attempts, next_attempt_at, created_at)
		SELECT seq, 'search', 1, now() + interval '1 minute', now() - interval '30 minutes' FROM outbox_events WHERE id = $1`, poisoned)
	return pool, poisoned, owed, whole
}

// table returns the table of body that starts with start.
func table(t *testing.T, body, start string) string {
	t.Helper()
	i := strings.Index(body, start)
	require.NotEqual(t, -1, i, start)
	return body[i : i+strings.Index(body[i:], "</table>")]
}

func TestRelaysPage(t *testing.T) {
	t.Parallel()
	pool, _, _, _ := pairs(t)
	srv := serve(t, pool, eventsui.Config{Prefix: "/outbox", Authorize: allowAll})

	code, body := get(t, srv.URL+"/outbox/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<a href="/outbox/relays" id="nav-relays"`)
	require.Contains(t, body, `<a href="/outbox/subscribers" id="nav-subscribers"`)

	// The overview names the orphan and sends to the subscribers page; it
	// counts the owed and poisoned pairs.
	require.Contains(t, body, `<div class="warning orphan" id="orphaned"><strong>Orphaned: ghost.</strong>`)
	require.Contains(t, body, `see <a href="/outbox/subscribers">Subscribers</a>`)
	require.Contains(t, body, `<div class="n" id="owed">2</div><div class="l">owed deliveries (1 paused)</div>`)
	require.Contains(t, body, `<div class="n" id="poisoned-deliveries">1</div>`)
	later := serve(t, pool, eventsui.Config{Prefix: "/outbox", Authorize: allowAll, Outbox: events.Outbox{OrphanAfter: 2 * time.Hour}})
	_, body = get(t, later.URL+"/outbox/")
	require.NotContains(t, body, "Orphaned:", "with OrphanAfter 2h, ghost (served an hour ago) is not orphaned")
	_, body = get(t, later.URL+"/outbox/subscribers")
	require.NotContains(t, body, `class="warning orphan"`)

	code, body = get(t, srv.URL+"/outbox/relays")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "<script>", "a relay's host is escaped")
	require.Contains(t, body, "web-1&lt;script&gt;alert(1)&lt;/script&gt;")
	require.Equal(t, 3, strings.Count(body, "<tr data-relay="))
	rows := strings.Split(body[strings.Index(body, "<tr data-relay="):], "<tr data-relay=")[1:]
	require.Contains(t, rows[0], "web-0")
	require.Contains(t, rows[0], ">stopped</span>")
	require.Contains(t, rows[0], "v0.1.0")
	require.Contains(t, rows[1], ">running</span>")
	require.Contains(t, rows[1], "pid 42")
	require.Contains(t, rows[1], "audit, search, mail, evil/&lt;b&gt;x&lt;/b&gt;")
	require.Contains(t, rows[1], `<td class="mode">listening</td>`)
	require.Contains(t, rows[2], ">dead</span>", "silent for 10 minutes without stopping")
	require.Contains(t, rows[2], `<td class="mode">polling</td>`)
	require.Contains(t, rows[2], `<span class="error-text">3</span>`)

	nobody := serve(t, pool, eventsui.Config{Authorize: func(*http.Request, eventsui.Action) bool { return false }})
	code, _ = get(t, nobody.URL+"/relays")
	require.Equal(t, http.StatusForbidden, code)
}

func TestSubscribersPage(t *testing.T) {
	t.Parallel()
	pool, _, _, _ := pairs(t)
	srv := serve(t, pool, eventsui.Config{Prefix: "/outbox", Authorize: allowAll})

	code, body := get(t, srv.URL+"/outbox/subscribers")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "<b>x</b>", "a subscriber's name is escaped")
	require.NotContains(t, body, "<script>")

	// The orphan: a warning naming the fix, and its row marked.
	require.Contains(t, body, `<div class="warning orphan" data-subscriber="ghost"><strong>ghost is orphaned:</strong> no running relay has served it for 15m0s`)
	require.Contains(t, body, "Deploy a release that has it, or retire it")
	require.Equal(t, 1, strings.Count(body, `class="warning orphan"`), "only ghost")
	ghost := row(t, body, `<tr data-subscriber="ghost">`)
	require.Contains(t, ghost, ">orphaned</span>")
	require.Contains(t, ghost, "none in the last day", "no relay has it")

	search := row(t, body, `<tr data-subscriber="search">`)
	require.Contains(t, search, `<td class="owed">2</td>`)
	require.Contains(t, search, `<td class="mono nowrap oldest">2h0m0s</td>`)
	require.Contains(t, search, `<td class="poisoned-count">0</td>`)
	require.Contains(t, search, "web-1&lt;script&gt;", "last served by the relay seen last")
	require.Contains(t, search, ": seq 2, <span class=\"muted\">in progress</span>")
	require.Contains(t, search, `action="/outbox/subscribers/search/pause"`)

	mail := row(t, body, `<tr data-subscriber="mail">`)
	require.Contains(t, mail, ">paused</span>")
	require.Contains(t, mail, `>1</a></td>`, "one poisoned pair")
	require.Contains(t, mail, `action="/outbox/subscribers/mail/resume"`)
	require.NotContains(t, mail, "/pause")

	old := row(t, body, `<tr data-subscriber="old">`)
	require.Contains(t, old, ">retired</span>")
	require.NotContains(t, old, "<form", "a retired subscriber is neither paused nor resumed")

	evil := row(t, body, `<tr data-subscriber="evil/&lt;b&gt;x&lt;/b&gt;">`)
	require.Contains(t, evil, `action="/outbox/subscribers/evil%2F%3Cb%3Ex%3C%2Fb%3E/pause"`)
}

func TestPoisonedListNamesTheSubscribers(t *testing.T) {
	t.Parallel()
	pool, poisoned, owed, whole := pairs(t)
	srv := serve(t, pool, eventsui.Config{Authorize: allowAll})
	code, body := get(t, srv.URL+"/events?state=poisoned")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "<th>For subscribers</th>")
	i := strings.Index(body, poisoned.String())
	require.NotEqual(t, -1, i)
	require.Contains(t, body[i:i+strings.Index(body[i:], "</tr>")], `<td class="mono poisoned-for">mail</td>`)
	j := strings.Index(body, whole.String())
	require.NotEqual(t, -1, j)
	require.Contains(t, body[j:j+strings.Index(body[j:], "</tr>")], "all (before fan-out)")
	require.NotContains(t, body, owed.String(), "an owed pair is not poisoned")
}

func TestEventShowsEachSubscribersDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, poisoned, _, _ := pairs(t)
	srv := serve(t, pool, eventsui.Config{Prefix: "/outbox", RiverUIURL: "/riverui", Authorize: allowAll})
	base := srv.URL + "/outbox"

	code, body := get(t, base+"/events/"+poisoned.String())
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "<img", "an attempt's error is escaped")
	audit := row(t, body, `<tr data-subscriber="audit" data-state="delivered">`)
	require.Contains(t, audit, `<a href="/riverui/jobs/21">21</a>`)
	search := row(t, body, `<tr data-subscriber="search" data-state="owed">`)
	require.Contains(t, search, "<td>1</td>", "its attempts")
	require.NotContains(t, search, "Requeue", "an owed pair has nothing to requeue")
	mail := row(t, body, `<tr data-subscriber="mail" data-state="poisoned">`)
	require.Contains(t, mail, "&lt;img src=x onerror=alert(1)&gt;")
	require.Contains(t, mail, `<form method="post" action="/outbox/events/`+poisoned.String()+`/deliveries/mail/requeue">`)
	require.Contains(t, mail, `href="/outbox/events/`+poisoned.String()+`/deliveries/mail/discard"`)
	require.NotContains(t, mail, `action="/outbox/events/`+poisoned.String()+`/deliveries/mail/discard"`, "Discard asks first")
	history := table(t, body, `<table class="history" data-subscriber="mail">`)
	require.Contains(t, history, "smtp down")

	// Requeue the pair: it is owed again, and its error history is still shown.
	code, loc := post(t, base+"/events/"+poisoned.String()+"/deliveries/mail/requeue", "same-origin")
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/outbox/events/"+poisoned.String()+"?done="+url.QueryEscape("Event "+poisoned.String()+" requeued for mail."), loc)
	info, err := outbox.GetEvent(ctx, pool, poisoned)
	require.NoError(t, err)
	require.Len(t, info.Deliveries, 2)
	require.False(t, info.Deliveries[0].Poisoned(), "mail's pair is owed again")
	_, body = get(t, srv.URL+loc)
	require.Contains(t, body, "requeued for mail")
	row(t, body, `<tr data-subscriber="mail" data-state="owed">`)
	history = table(t, body, `<table class="history" data-subscriber="mail">`)
	require.Contains(t, history, "smtp down", "the history survives the requeue")
}

func TestPairActionsAreGuarded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, poisoned, owed, _ := pairs(t)
	srv := serve(t, pool, eventsui.Config{Authorize: allowAll})
	deliveryURL := srv.URL + "/events/" + poisoned.String() + "/deliveries/mail"
	stillPoisoned := func(msg string) {
		t.Helper()
		info, err := outbox.GetEvent(ctx, pool, poisoned)
		require.NoError(t, err)
		require.True(t, info.Deliveries[0].Subscriber == "mail" && info.Deliveries[0].Poisoned(), msg)
	}

	code, _ := get(t, deliveryURL+"/requeue")
	require.Equal(t, http.StatusMethodNotAllowed, code, "GET changes nothing")
	for _, action := range []string{"requeue", "discard"} {
		code, _ = post(t, deliveryURL+"/"+action, "cross-site")
		require.Equal(t, http.StatusForbidden, code, "%s: cross-origin", action)
	}
	stillPoisoned("cross-origin posts change nothing")

	_, body := get(t, srv.URL+"/events/"+poisoned.String())
	require.Contains(t, body, "delivery-requeue", "the control: allowed, the buttons show")
	require.Contains(t, body, "delivery-discard")

	viewOnly := serve(t, pool, eventsui.Config{Authorize: func(_ *http.Request, a eventsui.Action) bool { return a == eventsui.ActionView }})
	code, body = get(t, viewOnly.URL+"/events/"+poisoned.String())
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "delivery-requeue", "no button the hook would refuse")
	require.NotContains(t, body, "delivery-discard")
	code, _ = post(t, viewOnly.URL+"/events/"+poisoned.String()+"/deliveries/mail/requeue", "same-origin")
	require.Equal(t, http.StatusForbidden, code)
	code, _ = get(t, viewOnly.URL+"/events/"+poisoned.String()+"/deliveries/mail/discard")
	require.Equal(t, http.StatusForbidden, code, "nor the confirmation")

	readOnly := serve(t, pool, eventsui.Config{Authorize: allowAll, ReadOnly: true})
	_, body = get(t, readOnly.URL+"/events/"+poisoned.String())
	require.NotContains(t, body, "delivery-requeue")
	require.NotContains(t, body, "delivery-discard")
	code, _ = post(t, readOnly.URL+"/events/"+poisoned.String()+"/deliveries/mail/discard", "same-origin")
	require.Equal(t, http.StatusForbidden, code)
	stillPoisoned("refused posts change nothing")

	// Not poisoned, not owed at all, not an event.
	code, _ = post(t, srv.URL+"/events/"+owed.String()+"/deliveries/search/requeue", "same-origin")
	require.Equal(t, http.StatusConflict, code)
	code, _ = get(t, srv.URL+"/events/"+owed.String()+"/deliveries/search/discard")
	require.Equal(t, http.StatusConflict, code)
	code, _ = post(t, srv.URL+"/events/"+poisoned.String()+"/deliveries/ghost/discard", "same-origin")
	require.Equal(t, http.StatusNotFound, code)
	code, _ = get(t, srv.URL+"/events/"+poisoned.String()+"/deliveries/ghost/discard")
	require.Equal(t, http.StatusNotFound, code)
	code, _ = post(t, srv.URL+"/events/nope/deliveries/mail/requeue", "same-origin")
	require.Equal(t, http.StatusBadRequest, code)

	// The confirmation, then the discard: that pair alone goes.
	code, body = get(t, deliveryURL+"/discard")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "Discard this event for subscriber mail for good?")
	require.Contains(t, body, `<form method="post" action="/events/`+poisoned.String()+`/deliveries/mail/discard">`)
	require.Contains(t, body, "&lt;img src=x onerror=alert(1)&gt;", "the pair's last error, escaped")
	require.NotContains(t, body, "<img")
	stillPoisoned("the confirmation changes nothing")
	code, loc := post(t, deliveryURL+"/discard", "same-origin")
	require.Equal(t, http.StatusSeeOther, code)
	require.True(t, strings.HasPrefix(loc, "/events/"+poisoned.String()+"?done="), loc)
	info, err := outbox.GetEvent(ctx, pool, poisoned)
	require.NoError(t, err, "the event stays")
	require.Len(t, info.Deliveries, 1)
	require.Equal(t, "search", info.Deliveries[0].Subscriber, "search's pair stays")
	require.Equal(t, map[string]int64{"audit": 21}, info.Fanout)
}

func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _, _, _ := pairs(t)
	paused := func(name string) bool {
		t.Helper()
		var p bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT paused_at IS NOT NULL FROM outbox_subscribers WHERE name = $1`, name).Scan(&p))
		return p
	}
	srv := serve(t, pool, eventsui.Config{Authorize: allowAll})

	code, _ := get(t, srv.URL+"/subscribers/search/pause")
	require.Equal(t, http.StatusMethodNotAllowed, code)
	code, _ = post(t, srv.URL+"/subscribers/search/pause", "cross-site")
	require.Equal(t, http.StatusForbidden, code)
	require.False(t, paused("search"))

	code, loc := post(t, srv.URL+"/subscribers/search/pause", "same-origin")
	require.Equal(t, http.StatusSeeOther, code)
	require.True(t, paused("search"))
	_, body := get(t, srv.URL+loc)
	require.Contains(t, body, "Subscriber search paused.")
	require.Contains(t, row(t, body, `<tr data-subscriber="search">`), `action="/subscribers/search/resume"`)
	code, _ = post(t, srv.URL+"/subscribers/search/resume", "same-origin")
	require.Equal(t, http.StatusSeeOther, code)
	require.False(t, paused("search"))

	// A name with a slash and markup reaches the library whole.
	code, _ = post(t, srv.URL+"/subscribers/"+url.PathEscape(evilName)+"/pause", "same-origin")
	require.Equal(t, http.StatusSeeOther, code)
	require.True(t, paused(evilName))
	code, _ = post(t, srv.URL+"/subscribers/nobody/pause", "same-origin")
	require.Equal(t, http.StatusNotFound, code)
	code, _ = post(t, srv.URL+"/subscribers/old/pause", "same-origin")
	require.Equal(t, http.StatusNotFound, code, "a retired subscriber")

	// Only the actions the hook allows show; the others are refused.
	pauseOnly := serve(t, pool, eventsui.Config{Authorize: func(_ *http.Request, a eventsui.Action) bool {
		return a == eventsui.ActionView || a == eventsui.ActionPause
	}})
	_, body = get(t, pauseOnly.URL+"/subscribers")
	require.Contains(t, row(t, body, `<tr data-subscriber="search">`), `/subscribers/search/pause`)
	require.NotContains(t, row(t, body, `<tr data-subscriber="mail">`), "/resume", "resume is not allowed")
	code, _ = post(t, pauseOnly.URL+"/subscribers/mail/resume", "same-origin")
	require.Equal(t, http.StatusForbidden, code)
	require.True(t, paused("mail"))

	readOnly := serve(t, pool, eventsui.Config{Authorize: allowAll, ReadOnly: true})
	code, body = get(t, readOnly.URL+"/subscribers")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "<form", "no buttons in read-only mode")
	code, _ = post(t, readOnly.URL+"/subscribers/mail/resume", "same-origin")
	require.Equal(t, http.StatusForbidden, code)
	require.True(t, paused("mail"))
}
