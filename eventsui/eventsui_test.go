package eventsui_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/eventstest"
	"github.com/standmeet/events/eventsui"
	"github.com/standmeet/events/internal/testdb"
)

func TestMain(m *testing.M) { os.Exit(eventstest.Main(m)) }

// outbox is the zero Outbox: the tables on the search_path.
var outbox events.Outbox

func allowAll(*http.Request, eventsui.Action) bool { return true }

// fixture makes a database with a pending event whose payload is hostile
// markup, a poisoned event and a fanned-out one.
func fixture(t *testing.T) (pool *pgxpool.Pool, pending, poisoned, fanned uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	pool = eventstest.Pool(t)
	pending, poisoned, fanned = uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	for _, insert := range []struct {
		sql string
		id  uuid.UUID
	}{
		{`INSERT INTO outbox_events (id, type, subject, payload) VALUES ($1, 'note.changed', 'note:<b>1</b>', '{"title":"<script>alert(1)</script>"}')`, pending},
		{`INSERT INTO outbox_events (id, type, subject, attempts, last_error, poisoned_at) VALUES ($1, 'ledger.entry', 'entry:3', 5, 'no <i>template</i>', now())`, poisoned},
		{`INSERT INTO outbox_events (id, type, subject, fanned_out_at, fanout) VALUES ($1, 'note.changed', 'note:2', now(), '{"search":12}')`, fanned},
	} {
		_, err := pool.Exec(ctx, insert.sql, insert.id)
		require.NoError(t, err)
	}
	return pool, pending, poisoned, fanned
}

func serve(t *testing.T, pool *pgxpool.Pool, opts eventsui.Config) *httptest.Server {
	t.Helper()
	h, err := eventsui.NewHandler(pool, &opts)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle(opts.Prefix+"/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// noRedirect is a client that shows redirects instead of following them.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func get(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := noRedirect.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// post sends a form POST as a browser would, same-origin unless site says
// otherwise.
func post(t *testing.T, u, site string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(""))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", site)
	resp, err := noRedirect.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Location")
}

func TestEveryPage(t *testing.T) {
	t.Parallel()
	pool, pending, poisoned, fanned := fixture(t)
	srv := serve(t, pool, eventsui.Config{Prefix: "/outbox", RiverUIURL: "/riverui", Authorize: allowAll})
	base := srv.URL + "/outbox"

	code, body := get(t, base+"/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<div class="n" id="pending">1</div>`)
	require.Contains(t, body, `<div class="n" id="poisoned">1</div>`)

	for state, want := range map[string]uuid.UUID{"pending": pending, "poisoned": poisoned, "recent": fanned} {
		code, body = get(t, base+"/events?state="+state)
		require.Equal(t, http.StatusOK, code, state)
		require.Contains(t, body, want.String(), state)
	}
	code, body = get(t, base+"/events?state=retrying")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "No retrying events")
	code, body = get(t, base+"/events?state=recent&type=ledger.*")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, fanned.String(), "type filter")

	// User data is escaped everywhere.
	code, body = get(t, base+"/events/"+pending.String())
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "<script>alert(1)</script>")
	require.Contains(t, body, "&lt;script&gt;alert(1)&lt;/script&gt;")
	require.NotContains(t, body, "<b>1</b>")
	code, body = get(t, base+"/events/"+poisoned.String())
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "no &lt;i&gt;template&lt;/i&gt;")
	require.Contains(t, body, `id="requeue"`)

	// Fanout links to River UI.
	_, body = get(t, base+"/events/"+fanned.String())
	require.Contains(t, body, `href="/riverui/jobs/12"`)

	code, _ = get(t, base+"/static/style.css")
	require.Equal(t, http.StatusOK, code)
	code, _ = get(t, base+"/events/"+uuid.Must(uuid.NewV7()).String())
	require.Equal(t, http.StatusNotFound, code)
	code, _ = get(t, base+"/events/nope")
	require.Equal(t, http.StatusBadRequest, code)
	code, _ = get(t, base+"/events?state=sideways")
	require.Equal(t, http.StatusBadRequest, code)
	code, _ = get(t, base+"/events?state=pending&type=a*")
	require.Equal(t, http.StatusBadRequest, code)
}

func TestRequeueAndDiscardArePostOnlyAndGuarded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, pending, poisoned, _ := fixture(t)
	srv := serve(t, pool, eventsui.Config{Authorize: allowAll})

	code, _ := get(t, srv.URL+"/events/"+poisoned.String()+"/requeue")
	require.Equal(t, http.StatusMethodNotAllowed, code, "GET changes nothing")
	code, _ = post(t, srv.URL+"/events/"+poisoned.String()+"/requeue", "cross-site")
	require.Equal(t, http.StatusForbidden, code, "a cross-origin POST is refused")
	info, err := outbox.GetEvent(ctx, pool, poisoned)
	require.NoError(t, err)
	require.True(t, info.Poisoned())

	code, _ = post(t, srv.URL+"/events/"+pending.String()+"/requeue", "same-origin")
	require.Equal(t, http.StatusConflict, code, "only poisoned events")

	code, loc := post(t, srv.URL+"/events/"+poisoned.String()+"/requeue", "same-origin")
	require.Equal(t, http.StatusSeeOther, code)
	require.True(t, strings.HasPrefix(loc, "/events/"+poisoned.String()), loc)
	info, err = outbox.GetEvent(ctx, pool, poisoned)
	require.NoError(t, err)
	require.False(t, info.Poisoned())
	_, body := get(t, srv.URL+loc)
	require.Contains(t, body, "requeued")

	// Discard: poison it again by hand, then discard.
	_, err = pool.Exec(ctx, "UPDATE outbox_events SET poisoned_at = now() WHERE id = $1", poisoned)
	require.NoError(t, err)
	code, loc = post(t, srv.URL+"/events/"+poisoned.String()+"/discard", "same-origin")
	require.Equal(t, http.StatusSeeOther, code)
	u, err := url.Parse(loc)
	require.NoError(t, err)
	require.Equal(t, "poisoned", u.Query().Get("state"))
	_, err = outbox.GetEvent(ctx, pool, poisoned)
	require.ErrorIs(t, err, events.ErrNotFound)
}

func TestAuthorizationAndReadOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _, poisoned, _ := fixture(t)

	_, err := eventsui.NewHandler(pool, &eventsui.Config{})
	require.ErrorContains(t, err, "Authorize is required", "the view never ships open")
	var ve *events.ValidationError
	require.ErrorAs(t, err, &ve)
	require.ErrorIs(t, err, events.ErrInvalidConfig)
	require.Equal(t, "Authorize", ve.Field)
	_, err = eventsui.NewHandler(pool, &eventsui.Config{Authorize: func(*http.Request, eventsui.Action) bool { return true }, Outbox: events.Outbox{Schema: "a-b"}})
	require.ErrorIs(t, err, events.ErrInvalidConfig)

	viewOnly := serve(t, pool, eventsui.Config{Authorize: func(_ *http.Request, a eventsui.Action) bool { return a == eventsui.ActionView }})
	code, _ := post(t, viewOnly.URL+"/events/"+poisoned.String()+"/requeue", "same-origin")
	require.Equal(t, http.StatusForbidden, code, "the hook refuses requeue")
	nobody := serve(t, pool, eventsui.Config{Authorize: func(*http.Request, eventsui.Action) bool { return false }})
	code, _ = get(t, nobody.URL+"/")
	require.Equal(t, http.StatusForbidden, code, "the hook refuses viewing")

	readOnly := serve(t, pool, eventsui.Config{Authorize: allowAll, ReadOnly: true})
	code, body := get(t, readOnly.URL+"/events/"+poisoned.String())
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, `id="requeue"`)
	require.NotContains(t, body, `id="discard"`)
	code, _ = post(t, readOnly.URL+"/events/"+poisoned.String()+"/discard", "same-origin")
	require.Equal(t, http.StatusForbidden, code)

	info, err := outbox.GetEvent(ctx, pool, poisoned)
	require.NoError(t, err)
	require.True(t, info.Poisoned(), "nothing changed")
}

// job inserts a River job (through River) and leaves it in state after
// attempt attempts, the last failing with lastError; it returns the job ID.
func job(t *testing.T, pool *pgxpool.Pool, state string, attempt int, lastError string) int64 {
	t.Helper()
	ctx := context.Background()
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	require.NoError(t, err)
	res, err := client.Insert(ctx, searchArgs{Subject: "note:1"}, nil)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE river_job SET state = $2::text::river_job_state, attempt = $3::smallint, attempted_at = now(),
		errors = CASE WHEN $4 = '' THEN NULL ELSE ARRAY[jsonb_build_object('at', now(), 'attempt', $3::int, 'error', $4::text)] END,
		finalized_at = CASE WHEN $2::text IN ('completed', 'discarded', 'cancelled') THEN now() END
		WHERE id = $1`, res.Job.ID, state, attempt, lastError)
	require.NoError(t, err)
	return res.Job.ID
}

// postForm is post with a form body.
func postForm(t *testing.T, u, site string, form url.Values) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", site)
	resp, err := noRedirect.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Location")
}

func TestEventShowsEachJobsRiverState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := eventstest.Pool(t)
	done := job(t, pool, "completed", 1, "")
	failing := job(t, pool, "retryable", 2, `index <script>alert(1)</script> read-only`)
	gone := done + failing + 100
	id := uuid.Must(uuid.NewV7())
	_, err := pool.Exec(ctx, `INSERT INTO outbox_events (id, type, subject, fanned_out_at, fanout) VALUES ($1, 'note.changed', 'note:1', now(), $2)`,
		id, fmt.Sprintf(`{"audit": %d, "search": %d, "mail": %d}`, done, failing, gone))
	require.NoError(t, err)
	srv := serve(t, pool, eventsui.Config{RiverUIURL: "/riverui/", Authorize: allowAll})

	code, body := get(t, srv.URL+"/events/"+id.String())
	require.Equal(t, http.StatusOK, code)
	row := func(sub string) string {
		i := strings.Index(body, `<tr data-subscriber="`+sub+`">`)
		require.NotEqual(t, -1, i, sub)
		return body[i : i+strings.Index(body[i:], "</tr>")]
	}
	audit, search, mail := row("audit"), row("search"), row("mail")
	require.Contains(t, audit, fmt.Sprintf(`<a href="/riverui/jobs/%d">%d</a>`, done, done))
	require.Contains(t, audit, `<span class="job-state completed">completed</span>`)
	require.Contains(t, audit, "1 / 25")
	require.Contains(t, search, `<span class="job-state retryable">retryable</span>`)
	require.Contains(t, search, "2 / 25")
	require.Contains(t, search, "index &lt;script&gt;alert(1)&lt;/script&gt; read-only", "River's error, escaped")
	require.Contains(t, mail, ">gone</span>", "a job River deleted")
	require.NotContains(t, body, "<script>")
}

func TestDiscardAsksFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, pending, poisoned, _ := fixture(t)
	srv := serve(t, pool, eventsui.Config{Prefix: "/outbox", Authorize: allowAll})
	base := srv.URL + "/outbox"

	// The detail page links to the confirmation; it has no form that discards.
	_, body := get(t, base+"/events/"+poisoned.String())
	require.Contains(t, body, `href="/outbox/events/`+poisoned.String()+`/discard"`)
	require.NotContains(t, body, `action="/outbox/events/`+poisoned.String()+`/discard"`)

	code, body := get(t, base+"/events/"+poisoned.String()+"/discard")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<form method="post" action="/outbox/events/`+poisoned.String()+`/discard">`)
	require.Contains(t, body, "Discard this poisoned event for good?")
	require.Contains(t, body, "no &lt;i&gt;template&lt;/i&gt;", "the event's last error, escaped")
	require.Contains(t, body, `id="cancel" href="/outbox/events/`+poisoned.String()+`"`)
	_, err := outbox.GetEvent(ctx, pool, poisoned)
	require.NoError(t, err, "showing the confirmation changes nothing")

	code, _ = get(t, base+"/events/"+pending.String()+"/discard")
	require.Equal(t, http.StatusConflict, code, "only poisoned events")
	code, _ = get(t, base+"/events/"+uuid.Must(uuid.NewV7()).String()+"/discard")
	require.Equal(t, http.StatusNotFound, code)
	code, _ = post(t, base+"/events/"+poisoned.String()+"/discard", "cross-site")
	require.Equal(t, http.StatusForbidden, code, "the confirmed POST is refused cross-origin")
	_, err = outbox.GetEvent(ctx, pool, poisoned)
	require.NoError(t, err)

	code, loc := post(t, base+"/events/"+poisoned.String()+"/discard", "same-origin")
	require.Equal(t, http.StatusSeeOther, code)
	require.True(t, strings.HasPrefix(loc, "/outbox/events?state=poisoned"), loc)
	_, err = outbox.GetEvent(ctx, pool, poisoned)
	require.ErrorIs(t, err, events.ErrNotFound)
}

func TestButtonsShowOnlyWhenAuthorized(t *testing.T) {
	t.Parallel()
	pool, _, poisoned, _ := fixture(t)
	only := func(allowed eventsui.Action) eventsui.Config {
		return eventsui.Config{Authorize: func(_ *http.Request, a eventsui.Action) bool { return a == eventsui.ActionView || a == allowed }}
	}
	for _, tc := range []struct {
		name                string
		opts                eventsui.Config
		requeue, discard    bool
		requeueGET, discGET int
	}{
		{"requeue only", only(eventsui.ActionRequeue), true, false, http.StatusOK, http.StatusForbidden},
		{"discard only", only(eventsui.ActionDiscard), false, true, http.StatusForbidden, http.StatusOK},
		{"view only", only(eventsui.ActionView), false, false, http.StatusForbidden, http.StatusForbidden},
		{"read-only", eventsui.Config{Authorize: allowAll, ReadOnly: true}, false, false, http.StatusForbidden, http.StatusForbidden},
	} {
		srv := serve(t, pool, tc.opts)
		_, detail := get(t, srv.URL+"/events/"+poisoned.String())
		_, list := get(t, srv.URL+"/events?state=poisoned")
		require.Equal(t, tc.requeue, strings.Contains(detail, `id="requeue"`), tc.name)
		require.Equal(t, tc.discard, strings.Contains(detail, `id="discard"`), tc.name)
		require.Equal(t, tc.requeue, strings.Contains(list, `id="bulk-requeue"`), tc.name)
		require.Equal(t, tc.discard, strings.Contains(list, `id="bulk-discard"`), tc.name)
		code, _ := get(t, srv.URL+"/bulk/requeue")
		require.Equal(t, tc.requeueGET, code, tc.name)
		code, _ = get(t, srv.URL+"/bulk/discard")
		require.Equal(t, tc.discGET, code, tc.name)
		code, _ = get(t, srv.URL+"/events/"+poisoned.String()+"/discard")
		require.Equal(t, tc.discGET, code, tc.name)
	}
}

// bulkFixture poisons three ledger events (one with a hostile subject) and
// a note event.
func bulkFixture(t *testing.T) (pool *pgxpool.Pool, ledger []uuid.UUID, note uuid.UUID) {
	t.Helper()
	pool = eventstest.Pool(t)
	for i, subject := range []string{"entry:1", "entry:<b>2</b>", "entry:3", "note:1"} {
		id := uuid.Must(uuid.NewV7())
		typ := "ledger.entry"
		if i == 3 {
			typ, note = "note.changed", id
		} else {
			ledger = append(ledger, id)
		}
		_, err := pool.Exec(context.Background(), `INSERT INTO outbox_events (id, type, subject, attempts, last_error, poisoned_at)
			VALUES ($1, $2, $3, 5, 'boom', now() - $4::int * interval '1 minute')`, id, typ, subject, i)
		require.NoError(t, err)
	}
	return pool, ledger, note
}

// hiddenIDs returns the IDs a confirmation form carries.
var hiddenIDRE = regexp.MustCompile(`<input type="hidden" name="id" value="([0-9a-f-]{36})">`)

func hiddenIDs(t *testing.T, body string) url.Values {
	t.Helper()
	form := url.Values{}
	for _, m := range hiddenIDRE.FindAllStringSubmatch(body, -1) {
		form.Add("id", m[1])
	}
	return form
}

func poisonedNow(t *testing.T, pool *pgxpool.Pool, ids ...uuid.UUID) (n int) {
	t.Helper()
	for _, id := range ids {
		info, err := outbox.GetEvent(context.Background(), pool, id)
		if err == nil && info.Poisoned() {
			n++
		}
	}
	return n
}

func TestBulkRequeueByFilterConfirmsTheCount(t *testing.T) {
	t.Parallel()
	pool, ledger, note := bulkFixture(t)
	srv := serve(t, pool, eventsui.Config{Authorize: allowAll})

	_, list := get(t, srv.URL+"/events?state=poisoned&type=ledger.**")
	require.Contains(t, list, `id="bulk-requeue" href="/bulk/requeue?type=ledger.%2A%2A"`)

	code, body := get(t, srv.URL+"/bulk/requeue?type=ledger.**")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "Requeue 3 poisoned events of type ledger.**?")
	require.Contains(t, body, "entry:&lt;b&gt;2&lt;/b&gt;")
	require.NotContains(t, body, "<b>2</b>")
	form := hiddenIDs(t, body)
	require.ElementsMatch(t, []string{ledger[0].String(), ledger[1].String(), ledger[2].String()}, form["id"])
	require.Equal(t, 4, poisonedNow(t, pool, append(ledger, note)...), "the confirmation changes nothing")

	code, _ = postForm(t, srv.URL+"/bulk/requeue", "cross-site", form)
	require.Equal(t, http.StatusForbidden, code)
	require.Equal(t, 4, poisonedNow(t, pool, append(ledger, note)...))

	// One of them is requeued by someone else meanwhile: skipped, not an error.
	_, err := outbox.Requeue(context.Background(), pool, events.PoisonedFilter{EventIDs: []uuid.UUID{ledger[2]}})
	require.NoError(t, err)
	code, loc := postForm(t, srv.URL+"/bulk/requeue", "same-origin", form)
	require.Equal(t, http.StatusSeeOther, code)
	u, err := url.Parse(loc)
	require.NoError(t, err)
	require.Equal(t, "2 events requeued. 1 skipped: no longer poisoned.", u.Query().Get("done"))
	require.Equal(t, 0, poisonedNow(t, pool, ledger...))
	require.Equal(t, 1, poisonedNow(t, pool, note), "outside the filter")

	code, body = get(t, srv.URL+"/bulk/requeue?type=ledger.**")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "No poisoned events of type ledger.**.")
	require.NotContains(t, body, `id="confirm"`)

	code, _ = get(t, srv.URL+"/bulk/requeue?type=a*")
	require.Equal(t, http.StatusBadRequest, code)
	code, _ = get(t, srv.URL+"/bulk/frobnicate")
	require.Equal(t, http.StatusNotFound, code)
	code, _ = postForm(t, srv.URL+"/bulk/requeue", "same-origin", url.Values{"id": {"nope"}})
	require.Equal(t, http.StatusBadRequest, code)
}

func TestBulkDiscardByFilterIsGuarded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, ledger, note := bulkFixture(t)
	srv := serve(t, pool, eventsui.Config{Authorize: allowAll})
	_, body := get(t, srv.URL+"/bulk/discard?subject=entry:3")
	require.Contains(t, body, "Discard 1 poisoned events with subject entry:3?")
	form := hiddenIDs(t, body)
	require.Equal(t, []string{ledger[2].String()}, form["id"])

	readOnly := serve(t, pool, eventsui.Config{Authorize: allowAll, ReadOnly: true})
	code, _ := postForm(t, readOnly.URL+"/bulk/discard", "same-origin", form)
	require.Equal(t, http.StatusForbidden, code)
	noDiscard := serve(t, pool, eventsui.Config{Authorize: func(_ *http.Request, a eventsui.Action) bool { return a != eventsui.ActionDiscard }})
	code, _ = postForm(t, noDiscard.URL+"/bulk/discard", "same-origin", form)
	require.Equal(t, http.StatusForbidden, code)
	require.Equal(t, 4, poisonedNow(t, pool, append(ledger, note)...))

	code, loc := postForm(t, srv.URL+"/bulk/discard", "same-origin", form)
	require.Equal(t, http.StatusSeeOther, code)
	require.Contains(t, loc, "done=1+events+discarded.")
	_, err := outbox.GetEvent(ctx, pool, ledger[2])
	require.ErrorIs(t, err, events.ErrNotFound)
	require.Equal(t, 3, poisonedNow(t, pool, ledger[0], ledger[1], note))
}

func TestPoisonedListShowsWhenPoisoned(t *testing.T) {
	t.Parallel()
	pool, _, poisoned, _ := fixture(t)
	_, err := pool.Exec(context.Background(), "UPDATE outbox_events SET poisoned_at = '2026-01-02 03:04:05Z', created_at = '2025-12-31 00:00:00Z' WHERE id = $1", poisoned)
	require.NoError(t, err)
	srv := serve(t, pool, eventsui.Config{Authorize: allowAll})
	_, body := get(t, srv.URL+"/events?state=poisoned")
	require.Contains(t, body, "<th>Poisoned</th>")
	require.Contains(t, body, `<td class="mono nowrap poisoned-at">2026-01-02 03:04:05.000Z</td>`)
	require.Contains(t, body, `<td class="mono id"><a href="/events/`+poisoned.String()+`">`)
	code, css := get(t, srv.URL+"/static/style.css")
	require.Equal(t, http.StatusOK, code)
	require.Regexp(t, `td\.id[^{]*\{[^}]*white-space: nowrap`, css)
}

// svgPath returns the d attribute of the chart's path of class class.
func svgPath(t *testing.T, body, chartID, class string) string {
	t.Helper()
	i := strings.Index(body, `<figure class="chart" id="`+chartID+`">`)
	require.NotEqual(t, -1, i, chartID)
	m := regexp.MustCompile(`<path class="` + class + `" d="([^"]*)">`).FindStringSubmatch(body[i:])
	require.NotNil(t, m, chartID)
	return m[1]
}

func TestOverviewChartsFanoutAndLag(t *testing.T) {
	t.Parallel()
	pool := eventstest.Pool(t)
	// 2 events fanned out 10 minutes ago after waiting 30 s; 1 just now,
	// after 2 s; one 3 hours ago (only in the 24-hour chart).
	_, err := pool.Exec(context.Background(), `INSERT INTO outbox_events (id, type, created_at, fanned_out_at, fanout) VALUES
		(gen_random_uuid(), 'a', now() - interval '10 minutes 30 seconds', now() - interval '10 minutes', '{}'),
		(gen_random_uuid(), 'a', now() - interval '10 minutes 30 seconds', now() - interval '10 minutes', '{}'),
		(gen_random_uuid(), 'a', now() - interval '2 seconds', now(), '{}'),
		(gen_random_uuid(), 'a', now() - interval '3 hours 1 minute', now() - interval '3 hours', '{}')`)
	require.NoError(t, err)
	srv := serve(t, pool, eventsui.Config{Authorize: allowAll})

	resp, err := noRedirect.Get(srv.URL + "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "script-src 'none'")

	code, body := get(t, srv.URL+"/")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "<script")
	line := svgPath(t, body, "fanned-chart", "line")
	points := strings.Count(line, "L") + 1
	require.GreaterOrEqual(t, points, 61, "a point per minute of the hour")
	require.LessOrEqual(t, points, 62)
	require.True(t, strings.HasPrefix(line, "M0.0,120.0L"), line)
	require.Contains(t, line, ",0.0L", "the peak minute (2 events) touches the top")
	require.Contains(t, svgPath(t, body, "fanned-chart", "area"), "Z")
	require.Contains(t, body, "peak 2 · latest")
	require.Contains(t, body, "3 events in all")
	require.Contains(t, svgPath(t, body, "lag-chart", "line"), ",0.0L", "the 30 s wait is the peak")
	require.Contains(t, body, "peak 30s")

	_, body = get(t, srv.URL+"/?range=24h")
	points = strings.Count(svgPath(t, body, "fanned-chart", "line"), "L") + 1
	require.GreaterOrEqual(t, points, 24*60+1)
	require.Contains(t, body, "4 events in all")
	require.Contains(t, body, `class="active" id="range-24h"`)
}

func TestOverviewAutoRefresh(t *testing.T) {
	t.Parallel()
	pool := eventstest.Pool(t)
	off := serve(t, pool, eventsui.Config{Authorize: allowAll})
	every30 := serve(t, pool, eventsui.Config{Authorize: allowAll, Refresh: 30 * time.Second})
	for _, tc := range []struct {
		srv  *httptest.Server
		path string
		want string // the meta's content; "" for none
	}{
		{off, "/", ""},
		{off, "/?refresh=10", "10"},
		{off, "/?refresh=1", "5"}, // at least every 5 s
		{off, "/?refresh=junk", ""},
		{off, "/events?state=pending&refresh=15", "15"},
		{every30, "/", "30"},
		{every30, "/?refresh=0", ""},
		{every30, "/events/" + uuid.Must(uuid.NewV7()).String(), ""}, // not on an error page
	} {
		_, body := get(t, tc.srv.URL+tc.path)
		if tc.want == "" {
			require.NotContains(t, body, `http-equiv="refresh"`, tc.path)
			continue
		}
		require.Contains(t, body, `<meta http-equiv="refresh" content="`+tc.want+`">`, tc.path)
	}
}

// Config.RiverClient inserts Replay's and Recover's deliveries: a client of
// another schema than Config.Outbox's is refused when the view is built, as
// Relay.Start refuses one, not when an operator presses Replay.
func TestNewHandlerRefusesARiverClientOfAnotherSchema(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	require.NoError(t, err)
	allow := func(*http.Request, eventsui.Action) bool { return true }
	_, err = eventsui.NewHandler(pool, &eventsui.Config{Authorize: allow, Outbox: events.Outbox{Schema: "billing"}, RiverClient: client})
	var ve *events.ValidationError
	require.ErrorAs(t, err, &ve)
	require.ErrorIs(t, err, events.ErrInvalidConfig)
	require.Equal(t, "RiverClient", ve.Field)
	_, err = eventsui.NewHandler(pool, &eventsui.Config{Authorize: allow, RiverClient: client})
	require.NoError(t, err)
}

type searchArgs struct {
	Subject string `json:"subject"`
}

func (searchArgs) Kind() string { return "search.reindex" }

type auditArgs struct {
	Subject string `json:"subject"`
}

func (auditArgs) Kind() string { return "audit.append" }

type searchWorker struct {
	river.WorkerDefaults[searchArgs]
}

func (searchWorker) Work(context.Context, *river.Job[searchArgs]) error { return nil }

type auditWorker struct {
	river.WorkerDefaults[auditArgs]
}

func (auditWorker) Work(context.Context, *river.Job[auditArgs]) error {
	return errors.New("audit log full")
}

// In a real browser, as an operator would: the overview's charts render;
// a poisoned event is opened and requeued, and its page then shows each
// subscriber's River job with River's state and error; another is discarded
// after the confirmation page; a filtered set is requeued in bulk after its
// confirmation; the relays page shows this process's relay running, and the
// subscribers page an orphan's warning and Pause and Resume. Every page is screenshotted into the test's temp dir (and
// $EVENTSUI_SCREENSHOTS when set, to look at them).
func TestBrowserOperatorFlows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := eventstest.Pool(t)

	// An hour of history for the charts.
	_, err := pool.Exec(ctx, `INSERT INTO outbox_events (id, type, created_at, fanned_out_at, fanout)
		SELECT gen_random_uuid(), 'history', f - (g % 7) * interval '1 second', f, '{}'
		  FROM generate_series(1, 1500) g, LATERAL (SELECT now() - (g % 58 + 1) * interval '1 minute' - (g % 13) * interval '1 second' AS f) t
		 WHERE g % 58 < 40 OR g % 3 = 0`)
	require.NoError(t, err)

	var fixed atomic.Bool
	relay, err := events.NewRelay(pool, &events.RelayConfig{MaxAttempts: 1, Listener: events.ListenerConfig{PollInterval: 100 * time.Millisecond}})
	require.NoError(t, err)
	require.NoError(t, relay.Subscribe(events.Subscriber{Name: "search", Types: []string{"**"},
		Map: func(_ context.Context, e events.Event) (river.JobArgs, *river.InsertOpts, error) {
			if !fixed.Load() {
				return nil, nil, errors.New("search index is read-only")
			}
			return searchArgs{Subject: e.Subject}, nil, nil
		}}))
	require.NoError(t, relay.Subscribe(events.Subscriber{Name: "audit", Types: []string{"note.*"},
		Map: func(_ context.Context, e events.Event) (river.JobArgs, *river.InsertOpts, error) {
			return auditArgs{Subject: e.Subject}, &river.InsertOpts{MaxAttempts: 1}, nil
		}}))
	workers := river.NewWorkers()
	river.AddWorker(workers, &searchWorker{})
	river.AddWorker(workers, &auditWorker{})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}}, Workers: workers,
		FetchCooldown: 20 * time.Millisecond, FetchPollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	defer client.Stop(ctx)
	require.NoError(t, relay.Start(ctx, client))
	defer relay.Stop(ctx)

	// Four poisoned events: one to requeue, one to discard, two ledger
	// entries to requeue in bulk.
	var requeued, discarded, ledger1, ledger2 events.Event
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		es, err := events.RecordMany(ctx, tx, []events.Event{
			{Type: "note.changed", Subject: "note:7", Payload: []byte(`{"title":"Plan"}`)},
			{Type: "note.deleted", Subject: "note:<b>8</b>"},
			{Type: "ledger.entry", Subject: "entry:1"},
			{Type: "ledger.entry", Subject: "entry:2"},
		})
		if err == nil {
			requeued, discarded, ledger1, ledger2 = es[0], es[1], es[2], es[3]
		}
		return err
	}))
	poisoned := func(e events.Event) bool {
		info, err := outbox.GetEvent(ctx, pool, e.ID)
		return err == nil && info.Poisoned()
	}
	require.Eventually(t, func() bool {
		return poisoned(requeued) && poisoned(discarded) && poisoned(ledger1) && poisoned(ledger2)
	}, 30*time.Second, 10*time.Millisecond)
	fixed.Store(true)

	ui, err := eventsui.NewHandler(pool, &eventsui.Config{Prefix: "/outbox", RiverUIURL: "/riverui",
		Authorize: func(*http.Request, eventsui.Action) bool { return true }})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/outbox/", ui)
	srv := httptest.NewServer(mux) // loopback only
	defer srv.Close()

	b := newBrowser(ctx, t, srv.URL)
	bctx := b.ctx

	// The overview: four poisoned, and both charts drawn.
	b.do(chromedp.Navigate(srv.URL + "/outbox/"))
	require.Equal(t, "4", b.text("#poisoned"))
	for _, chart := range []string{"#fanned-chart", "#lag-chart"} {
		d, err := chromedp.Run(bctx, chromedp.AttributeValue(chromedp.CSS(chart+" path.line"), "d"))
		require.NoError(t, err)
		require.True(t, d.Exists && strings.HasPrefix(d.Value, "M") && strings.Count(d.Value, "L") >= 60, "%s: %q", chart, d.Value)
		box, err := chromedp.Run(bctx, chromedp.Dimensions(chromedp.CSS(chart+" svg")))
		require.NoError(t, err)
		require.Greater(t, box.Width, int64(300), chart+" is laid out")
		require.Greater(t, box.Height, int64(100), chart+" is laid out")
	}
	b.screenshot("overview")

	// The poisoned list: when each was poisoned; IDs on one line.
	b.do(chromedp.Click(chromedp.CSS(`a.card[href$="state=poisoned"]`)), chromedp.WaitVisible(chromedp.CSS("td.poisoned-at")))
	style, err := chromedp.Run(bctx, chromedp.ComputedStyle(chromedp.CSS("td.id")))
	require.NoError(t, err)
	computed := map[string]string{}
	for _, p := range style {
		computed[p.Name] = p.Value
	}
	// white-space: nowrap, or its longhand in newer Chromium.
	require.Contains(t, []string{computed["white-space"], computed["text-wrap-mode"]}, "nowrap", "IDs do not wrap")
	b.screenshot("poisoned")

	// Requeue one; once fanned out, its page shows each job as River has it.
	b.do(chromedp.Click(chromedp.CSS(`a[href="/outbox/events/`+requeued.ID.String()+`"]`)), chromedp.WaitVisible(chromedp.ID("requeue")))
	// Per subscriber: delivered to audit, poisoned for search, with the
	// error history and the pair's own buttons.
	require.Equal(t, "delivered", b.text(`#deliveries tr[data-subscriber="audit"] .delivery-state`))
	require.Equal(t, "poisoned", b.text(`#deliveries tr[data-subscriber="search"] .delivery-state`))
	require.Contains(t, b.text(`table.history[data-subscriber="search"]`), "search index is read-only")
	b.do(chromedp.WaitVisible(chromedp.CSS(`#deliveries tr[data-subscriber="search"] button.delivery-requeue`)))
	b.screenshot("event-poisoned")
	b.do(chromedp.Click(chromedp.ID("requeue")), chromedp.WaitVisible(chromedp.CSS(".flash")))
	b.reloadUntil("each job's final state", func() (bool, string) {
		rows, err := chromedp.Run(bctx, chromedp.Nodes(chromedp.CSSAll("#jobs tbody tr"), chromedp.AtLeast(0)))
		require.NoError(t, err)
		if len(rows) < 2 {
			info, _ := outbox.GetEvent(ctx, pool, requeued.ID)
			return false, fmt.Sprintf("%s, %d rows, fanout %v", b.text("#state"), len(rows), info.Fanout)
		}
		search, audit := b.text(`#jobs tr[data-subscriber="search"] .job-state`), b.text(`#jobs tr[data-subscriber="audit"] .job-state`)
		return search == "completed" && audit == "discarded", search + ", " + audit
	})
	require.Equal(t, "fanned out", b.text("#state"))
	require.Contains(t, b.text(`#jobs tr[data-subscriber="audit"]`), "audit log full", "River's last error of the job")
	require.Contains(t, b.text(`#jobs tr[data-subscriber="audit"]`), "1 / 1")
	// Delivered to both now.
	require.Equal(t, "delivered", b.text(`#deliveries tr[data-subscriber="search"] .delivery-state`))
	b.screenshot("event-jobs")

	// Discard another, through its confirmation page.
	b.do(chromedp.Navigate(srv.URL+"/outbox/events/"+discarded.ID.String()), chromedp.Click(chromedp.ID("discard")),
		chromedp.WaitVisible(chromedp.ID("confirm")))
	require.Equal(t, "Discard this poisoned event for good?", b.text("#question"))
	require.True(t, poisoned(discarded), "nothing happens before the confirmation")
	b.screenshot("confirm-discard")
	b.do(chromedp.Click(chromedp.ID("confirm")), chromedp.WaitVisible(chromedp.CSS(".flash")))
	require.Contains(t, b.text(".flash"), "discarded")
	// Its poisoned delivery is dropped; the row (fanned out to nobody else)
	// stays for retention.
	info, err := outbox.GetEvent(ctx, pool, discarded.ID)
	require.NoError(t, err)
	require.False(t, info.Poisoned())
	require.Empty(t, info.Deliveries)

	// Requeue the ledger entries in bulk: filter, confirm the count, confirm.
	b.do(chromedp.SendKeys(chromedp.CSS(`form.filters input[name="type"]`), "ledger.*"),
		// The unfiltered page has a bulk-requeue link too: wait for the
		// filtered one.
		chromedp.Click(chromedp.CSS("form.filters button")), chromedp.WaitVisible(chromedp.CSS(`#bulk-requeue[href*="type=ledger"]`)))
	b.screenshot("poisoned-filtered")
	b.do(chromedp.Click(chromedp.ID("bulk-requeue")), chromedp.WaitVisible(chromedp.ID("confirm")))
	require.Equal(t, "Requeue 2 poisoned events of type ledger.*?", b.text("#question"))
	require.True(t, poisoned(ledger1) && poisoned(ledger2), "nothing happens before the confirmation")
	b.screenshot("confirm-bulk-requeue")
	b.do(chromedp.Click(chromedp.ID("confirm")), chromedp.WaitVisible(chromedp.CSS(".flash")))
	require.Equal(t, "2 events requeued.", b.text(".flash"))
	b.screenshot("poisoned-after-bulk")
	require.Eventually(t, func() bool {
		a, err1 := outbox.GetEvent(ctx, pool, ledger1.ID)
		c, err2 := outbox.GetEvent(ctx, pool, ledger2.ID)
		return err1 == nil && err2 == nil && len(a.Fanout) > 0 && len(c.Fanout) > 0 && len(a.Deliveries)+len(c.Deliveries) == 0
	}, 20*time.Second, 20*time.Millisecond, "the relay delivers the requeued entries")

	// The relays page, from the nav: this process's relay, running.
	b.do(chromedp.Click(chromedp.ID("nav-relays")), chromedp.WaitVisible(chromedp.ID("relays")))
	host, err := os.Hostname()
	require.NoError(t, err)
	// Its first report comes before it listens; the next ones (every 5 s)
	// say it listens and when it last fanned out.
	b.reloadUntil("this process's relay running and listening", func() (bool, string) {
		text := b.text("#relays tbody")
		return strings.Contains(text, host) && strings.Contains(text, fmt.Sprintf("pid %d", os.Getpid())) &&
			b.text("#relays tbody .relay-state") == "running" && b.text("#relays tbody .mode") == "listening" &&
			!strings.Contains(text, "never"), text
	})
	require.Contains(t, b.text("#relays tbody .subscribers"), "search")
	require.Contains(t, b.text("#relays tbody .subscribers"), "audit")
	b.screenshot("relays")

	// The subscribers page: a subscriber no relay serves any more is
	// orphaned, with the fix named; pause and resume audit with a click.
	_, err = pool.Exec(ctx, `INSERT INTO outbox_subscribers (name, registered_at, types, last_served_at)
		VALUES ('ghost', now() - interval '1 day', '{ledger.*}', now() - interval '1 hour')`)
	require.NoError(t, err)
	b.do(chromedp.Click(chromedp.ID("nav-subscribers")), chromedp.WaitVisible(chromedp.ID("subscribers")))
	require.Contains(t, b.text(`.warning.orphan[data-subscriber="ghost"]`), "Deploy a release that has it, or retire it")
	require.Equal(t, "orphaned", b.text(`tr[data-subscriber="ghost"] .sub-state`))
	require.Contains(t, b.text(`tr[data-subscriber="search"] .served-by`), host)
	b.do(chromedp.Click(chromedp.CSS(`tr[data-subscriber="audit"] button.pause`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-subscriber="audit"] button.resume`)))
	require.Equal(t, "Subscriber audit paused.", b.text(".flash"))
	require.Equal(t, "paused", b.text(`tr[data-subscriber="audit"] .sub-state`))
	b.screenshot("subscribers")
	// The page after the post has the pause button again (the flash is on
	// both pages, so it cannot tell them apart).
	b.do(chromedp.Click(chromedp.CSS(`tr[data-subscriber="audit"] button.resume`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-subscriber="audit"] button.pause`)))
	require.Equal(t, "Subscriber audit resumed.", b.text(".flash"))
	require.Equal(t, "active", b.text(`tr[data-subscriber="audit"] .sub-state`))

	b.do(chromedp.Navigate(srv.URL + "/outbox/?range=24h"))
	b.screenshot("overview-24h")
}
