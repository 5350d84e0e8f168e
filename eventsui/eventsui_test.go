package eventsui_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/eventstest"
	"github.com/standmeet/events/eventsui"
)

func TestMain(m *testing.M) { os.Exit(eventstest.Main(m)) }

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

func serve(t *testing.T, pool *pgxpool.Pool, opts eventsui.Options) *httptest.Server {
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
	srv := serve(t, pool, eventsui.Options{Prefix: "/outbox", RiverUIURL: "/riverui", Authorize: allowAll})
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
	srv := serve(t, pool, eventsui.Options{Authorize: allowAll})

	code, _ := get(t, srv.URL+"/events/"+poisoned.String()+"/requeue")
	require.Equal(t, http.StatusMethodNotAllowed, code, "GET changes nothing")
	code, _ = post(t, srv.URL+"/events/"+poisoned.String()+"/requeue", "cross-site")
	require.Equal(t, http.StatusForbidden, code, "a cross-origin POST is refused")
	info, err := events.Inspect(ctx, pool, poisoned)
	require.NoError(t, err)
	require.True(t, info.Poisoned())

	code, _ = post(t, srv.URL+"/events/"+pending.String()+"/requeue", "same-origin")
	require.Equal(t, http.StatusConflict, code, "only poisoned events")

	code, loc := post(t, srv.URL+"/events/"+poisoned.String()+"/requeue", "same-origin")
	require.Equal(t, http.StatusSeeOther, code)
	require.True(t, strings.HasPrefix(loc, "/events/"+poisoned.String()), loc)
	info, err = events.Inspect(ctx, pool, poisoned)
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
	_, err = events.Inspect(ctx, pool, poisoned)
	require.ErrorIs(t, err, events.ErrNotFound)
}

func TestAuthorizationAndReadOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _, poisoned, _ := fixture(t)

	_, err := eventsui.NewHandler(pool, &eventsui.Options{})
	require.ErrorContains(t, err, "Authorize is required", "the view never ships open")

	viewOnly := serve(t, pool, eventsui.Options{Authorize: func(_ *http.Request, a eventsui.Action) bool { return a == eventsui.ActionView }})
	code, _ := post(t, viewOnly.URL+"/events/"+poisoned.String()+"/requeue", "same-origin")
	require.Equal(t, http.StatusForbidden, code, "the hook refuses requeue")
	nobody := serve(t, pool, eventsui.Options{Authorize: func(*http.Request, eventsui.Action) bool { return false }})
	code, _ = get(t, nobody.URL+"/")
	require.Equal(t, http.StatusForbidden, code, "the hook refuses viewing")

	readOnly := serve(t, pool, eventsui.Options{Authorize: allowAll, ReadOnly: true})
	code, body := get(t, readOnly.URL+"/events/"+poisoned.String())
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, `id="requeue"`)
	require.NotContains(t, body, `id="discard"`)
	code, _ = post(t, readOnly.URL+"/events/"+poisoned.String()+"/discard", "same-origin")
	require.Equal(t, http.StatusForbidden, code)

	info, err := events.Inspect(ctx, pool, poisoned)
	require.NoError(t, err)
	require.True(t, info.Poisoned(), "nothing changed")
}
