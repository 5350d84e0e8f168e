package eventsui_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/eventstest"
	"github.com/standmeet/events/eventsui"
)

// chainSubject is the blocked subject of chainFixture: markup, escaped on
// the page and passed whole to the library.
const chainSubject = "acct:<b>7</b>/x"

// chainFixture makes an ordered subscriber's blocked subject: its head's
// job discarded, a second job pending behind it.
func chainFixture(t *testing.T) (pool *pgxpool.Pool, head, next int64) {
	t.Helper()
	ctx := context.Background()
	pool = eventstest.Pool(t)
	head = job(t, pool, "discarded", 1, "ledger <i>closed</i>")
	next = job(t, pool, "pending", 0, "")
	e1, e2 := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO outbox_events (id, type, subject, fanned_out_at, fanout) VALUES ($1, 'entry.posted', $3, now(), '{}'), ($2, 'entry.posted', $3, now(), '{}')`,
			[]any{e1, e2, chainSubject}},
		{`INSERT INTO outbox_chains (subscriber, subject, head_job, tail_job, next_pos, blocked_at, blocked_state, blocked_error)
			VALUES ('ledger', $1, $2, $3, 2, now(), 'discarded', 'ledger <i>closed</i>')`, []any{chainSubject, head, next}},
		{`INSERT INTO outbox_chain_jobs (job_id, subscriber, subject, pos, event_seq, event_id, event_type)
			SELECT $2::bigint, 'ledger', $1::text, 1, seq, id, type FROM outbox_events WHERE id = $4
			UNION ALL SELECT $3::bigint, 'ledger', $1::text, 2, seq, id, type FROM outbox_events WHERE id = $5`, []any{chainSubject, head, next, e1, e2}},
	} {
		_, err := pool.Exec(ctx, q.sql, q.args...)
		require.NoError(t, err)
	}
	return pool, head, next
}

func jobState(t *testing.T, pool *pgxpool.Pool, id int64) string {
	t.Helper()
	var s string
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT state::text FROM river_job WHERE id = $1", id).Scan(&s))
	return s
}

func TestChainsPageResumeAndSkip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, head, next := chainFixture(t)
	srv := serve(t, pool, eventsui.Config{Authorize: allowAll, RiverUIURL: "/riverui"})
	form := url.Values{"subscriber": {"ledger"}, "subject": {chainSubject}}

	code, body := get(t, srv.URL+"/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `id="blocked"`, "the overview warns of a blocked subject")
	require.Contains(t, body, `<div class="n" id="blocked-chains">1</div>`)

	code, body = get(t, srv.URL+"/chains?blocked=1")
	require.Equal(t, http.StatusOK, code)
	r := row(t, body, `<tr data-subscriber="ledger"`)
	require.Contains(t, r, "blocked")
	require.Contains(t, r, "acct:&lt;b&gt;7&lt;/b&gt;/x")
	require.NotContains(t, r, "<b>7")
	require.Contains(t, r, "ledger &lt;i&gt;closed&lt;/i&gt;")
	require.Contains(t, r, `/riverui/jobs/`)
	require.Contains(t, r, `action="/chains/resume"`)
	require.Contains(t, r, `action="/chains/skip"`)

	// Resume: POST only, same-origin only; the head's job is retried.
	code, _ = get(t, srv.URL+"/chains/resume")
	require.Equal(t, http.StatusMethodNotAllowed, code)
	code, _ = postForm(t, srv.URL+"/chains/resume", "cross-site", form)
	require.Equal(t, http.StatusForbidden, code)
	require.Equal(t, "discarded", jobState(t, pool, head))
	code, loc := postForm(t, srv.URL+"/chains/resume", "same-origin", form)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "available", jobState(t, pool, head))
	_, body = get(t, srv.URL+loc)
	require.Contains(t, body, "resumed")
	require.Contains(t, body, "No blocked subject.")
	code, _ = postForm(t, srv.URL+"/chains/resume", "same-origin", form)
	require.Equal(t, http.StatusConflict, code, "no longer blocked")

	// Blocked again; Skip asks first, then releases the next job.
	_, err := pool.Exec(ctx, "UPDATE river_job SET state = 'discarded', finalized_at = now() WHERE id = $1", head)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE outbox_chains SET blocked_at = now(), blocked_state = 'discarded'")
	require.NoError(t, err)
	code, body = get(t, srv.URL+"/chains/skip?"+form.Encode())
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `name="subject" value="acct:&lt;b&gt;7&lt;/b&gt;/x"`)
	require.Contains(t, body, `action="/chains/skip"`)
	require.Equal(t, "pending", jobState(t, pool, next), "a confirmation page changes nothing")
	code, _ = postForm(t, srv.URL+"/chains/skip", "same-origin", form)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "available", jobState(t, pool, next), "the next job runs")
	require.Equal(t, "discarded", jobState(t, pool, head), "the skipped job stays as River ended it")
	code, _ = postForm(t, srv.URL+"/chains/skip", "same-origin", url.Values{"subscriber": {"ledger"}, "subject": {"acct:9"}})
	require.Equal(t, http.StatusNotFound, code)
	code, _ = postForm(t, srv.URL+"/chains/skip", "same-origin", url.Values{"subscriber": {"ledger"}})
	require.Equal(t, http.StatusBadRequest, code)
}

func TestChainActionsAreGuarded(t *testing.T) {
	t.Parallel()
	pool, head, next := chainFixture(t)
	form := url.Values{"subscriber": {"ledger"}, "subject": {chainSubject}}
	resumeOnly := serve(t, pool, eventsui.Config{Authorize: func(_ *http.Request, a eventsui.Action) bool {
		return a == eventsui.ActionView || a == eventsui.ActionChainResume
	}})
	_, body := get(t, resumeOnly.URL+"/chains")
	r := row(t, body, `<tr data-subscriber="ledger"`)
	require.Contains(t, r, "/chains/resume")
	require.NotContains(t, r, "/chains/skip", "skip is not allowed")
	code, _ := get(t, resumeOnly.URL+"/chains/skip?"+form.Encode())
	require.Equal(t, http.StatusForbidden, code)
	code, _ = postForm(t, resumeOnly.URL+"/chains/skip", "same-origin", form)
	require.Equal(t, http.StatusForbidden, code)
	require.Equal(t, "pending", jobState(t, pool, next))

	readOnly := serve(t, pool, eventsui.Config{Authorize: allowAll, ReadOnly: true})
	code, body = get(t, readOnly.URL+"/chains?blocked=1")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "<form", "no buttons in read-only mode")
	code, _ = postForm(t, readOnly.URL+"/chains/resume", "same-origin", form)
	require.Equal(t, http.StatusForbidden, code)
	require.Equal(t, "discarded", jobState(t, pool, head))
}
