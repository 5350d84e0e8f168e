package eventsui_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
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
	"github.com/standmeet/events/webhook"
)

// whBundle is a database with two webhook endpoints, their attempt log and
// an insert-only River client; nothing is delivered.
type whBundle struct {
	pool             *pgxpool.Pool
	wh               *webhook.Webhooks
	client           *river.Client[pgx.Tx]
	orders, billing  webhook.Endpoint
	event, failedEvt uuid.UUID // events in the outbox, delivered to orders; failedEvt failed
}

// hostile markup in what comes from outside: an endpoint's description,
// a receiver's error and answer, an operator's reason.
const (
	hostileDescription = `Orders <script>alert("d")</script>`
	hostileError       = `status 500: <img src=x onerror=alert("e")>`
	hostileResponse    = "</pre></details><script>alert(\"r\")</script>\nline two of a long answer from the receiver, which goes on and on"
)

func webhookFixture(t *testing.T) *whBundle {
	t.Helper()
	ctx := context.Background()
	b := &whBundle{pool: eventstest.Pool(t)}
	var err error
	b.wh, err = webhook.New(b.pool, &webhook.Config{Keys: []webhook.Key{{ID: "ops-key", Key: make([]byte, 32)}}})
	require.NoError(t, err)
	b.client, err = river.NewClient(riverpgxv5.New(b.pool), &river.Config{})
	require.NoError(t, err)
	// Never contacted: nothing runs the deliveries.
	b.orders, err = b.wh.Create(ctx, webhook.EndpointParams{URL: "https://hooks.example.com/orders/in?token=s3cret-token",
		Description: hostileDescription, Types: []string{"order.*"}, Scopes: []string{"tenant:42"},
		Headers: map[string]string{"X-Tenant": "tenant-header-value"}, SecretHeaders: map[string]string{"Authorization": "Bearer sealed-bearer"}})
	require.NoError(t, err)
	b.billing, err = b.wh.Create(ctx, webhook.EndpointParams{URL: "https://billing.example.net:8443/in", Types: []string{"invoice.**"}})
	require.NoError(t, err)

	b.event, b.failedEvt = uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	for _, id := range []uuid.UUID{b.event, b.failedEvt} {
		_, err = b.pool.Exec(ctx, `INSERT INTO outbox_events (id, type, subject, fanned_out_at, fanout) VALUES ($1, 'order.placed', 'order:1', now(), '{}')`, id)
		require.NoError(t, err)
	}
	// orders: 3 of 4 succeeded in the last hour, in 10, 20, 30 and 40 ms;
	// one old failure outside the window; its breaker open.
	for _, a := range []struct {
		event    uuid.UUID
		status   int
		class    string
		err      string
		ms       int
		response string
		ago      string
	}{
		{b.failedEvt, 0, "timeout", "context deadline exceeded", 40, "", "2 hours"},
		{b.event, 200, "", "", 10, "ok", "40 minutes"},
		{b.event, 200, "", "", 20, "ok", "30 minutes"},
		{b.event, 200, "", "", 30, "ok", "20 minutes"},
		{b.failedEvt, 500, "status", hostileError, 40, hostileResponse, "10 minutes"},
	} {
		_, err = b.pool.Exec(ctx, `INSERT INTO webhook_attempts (endpoint_id, event_id, attempt, status, error_class, error, duration_ms, dialed_ip, response, created_at)
			VALUES ($1, $2, 1, $3, $4, $5, $6, '93.184.215.14', $7, now() - $8::interval)`, b.orders.ID, a.event, a.status, a.class, a.err, a.ms, a.response, a.ago)
		require.NoError(t, err)
	}
	_, err = b.pool.Exec(ctx, `UPDATE webhook_endpoint_health SET failures = 7, open_until = now() + interval '1 hour' WHERE endpoint_id = $1`, b.orders.ID)
	require.NoError(t, err)
	return b
}

func (b *whBundle) serve(t *testing.T, opts eventsui.Config) *httptest.Server {
	t.Helper()
	opts.Webhooks = b.wh
	if opts.RiverClient == nil {
		opts.RiverClient = b.client
	}
	return serve(t, b.pool, opts)
}

// deliveries counts the delivery jobs queued for endpoint.
func (b *whBundle) deliveries(t *testing.T, endpoint uuid.UUID) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM river_job WHERE kind = 'webhook.deliver' AND args->>'endpoint_id' = $1`, endpoint.String()).Scan(&n))
	return n
}

func (b *whBundle) get(t *testing.T, id uuid.UUID) webhook.Endpoint {
	t.Helper()
	e, err := b.wh.Get(context.Background(), id)
	require.NoError(t, err)
	return e
}

// row returns the table row of body that starts with start.
func row(t *testing.T, body, start string) string {
	t.Helper()
	i := strings.Index(body, start)
	require.NotEqual(t, -1, i, start)
	return body[i : i+strings.Index(body[i:], "</tr>")]
}

// secrets are what no endpoints page may show.
var secrets = []string{"s3cret-token", "token=", "tenant-header-value", "sealed-bearer", "whsec_", "orders/in?"}

func TestWebhookPagesOnlyWithWebhooks(t *testing.T) {
	t.Parallel()
	b := webhookFixture(t)
	without := serve(t, b.pool, eventsui.Config{Authorize: allowAll})
	_, body := get(t, without.URL+"/")
	require.NotContains(t, body, `id="nav-webhooks"`)
	code, _ := get(t, without.URL+"/webhooks")
	require.Equal(t, http.StatusNotFound, code)

	with := b.serve(t, eventsui.Config{Prefix: "/outbox", Authorize: allowAll})
	_, body = get(t, with.URL+"/outbox/")
	require.Contains(t, body, `<a href="/outbox/webhooks" id="nav-webhooks"`)
}

func TestWebhookEndpointsList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := webhookFixture(t)
	require.NoError(t, b.wh.Disable(ctx, b.billing.ID, `receiver <b>moved</b>`))
	srv := b.serve(t, eventsui.Config{Authorize: allowAll})

	code, body := get(t, srv.URL+"/webhooks")
	require.Equal(t, http.StatusOK, code)
	orders := row(t, body, `<tr data-endpoint="`+b.orders.ID.String()+`">`)
	require.Contains(t, orders, `<a class="host" href="/webhooks/`+b.orders.ID.String()+`">hooks.example.com</a>`)
	require.Contains(t, orders, "Orders &lt;script&gt;alert(&#34;d&#34;)&lt;/script&gt;", "the description, escaped")
	require.Contains(t, orders, `<span class="state fanned endpoint-state">enabled</span>`)
	require.Contains(t, orders, `<span class="breaker open">open</span>`)
	require.Contains(t, orders, "7 failures in a row")
	require.Contains(t, orders, `75.0 % <span class="muted">(3 of 4)</span>`, "the last hour only")
	require.Contains(t, orders, `<td class="mono nowrap p50">25ms</td>`)
	require.Contains(t, orders, `<td class="mono nowrap p95">39ms</td>`)
	require.Contains(t, orders, "order.*")
	require.Contains(t, orders, "tenant:42")
	require.NotContains(t, orders, "/orders/in", "the list shows the host only")

	billing := row(t, body, `<tr data-endpoint="`+b.billing.ID.String()+`">`)
	require.Contains(t, billing, ">billing.example.net:8443</a>")
	require.Contains(t, billing, `<span class="state poisoned endpoint-state">disabled</span>`)
	require.Contains(t, billing, "receiver &lt;b&gt;moved&lt;/b&gt;", "the reason, escaped")
	require.Contains(t, billing, `<span class="breaker closed">closed</span>`)
	require.Contains(t, billing, "no attempts")

	require.NotContains(t, body, "<script>")
	for _, s := range secrets {
		require.NotContains(t, body, s)
	}

	code, _ = get(t, srv.URL+"/webhooks?after=nope")
	require.Equal(t, http.StatusBadRequest, code)
	code, body = get(t, srv.URL+"/webhooks?after="+b.billing.ID.String())
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "No webhook endpoints.")
}

func TestWebhookEndpointDetail(t *testing.T) {
	t.Parallel()
	b := webhookFixture(t)
	srv := b.serve(t, eventsui.Config{Authorize: allowAll})

	code, body := get(t, srv.URL+"/webhooks/"+b.orders.ID.String())
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<dd class="mono" id="host">hooks.example.com</dd>`)
	require.Contains(t, body, `<dd class="mono" id="path">/orders/in</dd>`, "the path, never the query")
	require.Contains(t, body, "X-Tenant, Authorization")
	require.Contains(t, body, "sealed under ops-key")
	require.Contains(t, body, `<span class="breaker open">open</span>`)
	require.Contains(t, body, "75.0 % succeeded (3 of 4)")
	require.Contains(t, body, "p99")
	for _, s := range secrets[:5] {
		require.NotContains(t, body, s)
	}

	failed := row(t, body, `<tr data-attempt="`)
	require.Contains(t, failed, `<a href="/events/`+b.failedEvt.String()+`">`)
	require.Contains(t, failed, `<td class="status">500</td>`)
	require.Contains(t, failed, `<span class="job-state retryable error-class">status</span>`)
	require.Contains(t, failed, "status 500: &lt;img src=x onerror=alert(&#34;e&#34;)&gt;", "the error, escaped")
	require.Contains(t, failed, "40ms")
	require.Contains(t, failed, `<td class="mono nowrap dialed">93.184.215.14</td>`)
	require.Contains(t, failed, "<details><summary>&lt;/pre&gt;&lt;/details&gt;&lt;script&gt;", "a long answer folds, escaped")
	require.Contains(t, failed, "<pre>&lt;/pre&gt;&lt;/details&gt;&lt;script&gt;alert(&#34;r&#34;)&lt;/script&gt;\nline two")
	require.Contains(t, failed, `<input type="hidden" name="event" value="`+b.failedEvt.String()+`">`, "a replay per attempt")
	require.Equal(t, 5, strings.Count(body, `<tr data-attempt="`), "every attempt, the old one too")
	require.NotContains(t, body, "<script>")
	require.NotContains(t, body, "<img")

	_, body = get(t, srv.URL+"/webhooks/"+b.orders.ID.String()+"?failures=1")
	require.Equal(t, 2, strings.Count(body, `<tr data-attempt="`), "failures only")
	require.Contains(t, body, `class="active" id="failed-attempts"`)

	code, _ = get(t, srv.URL+"/webhooks/"+uuid.Must(uuid.NewV7()).String())
	require.Equal(t, http.StatusNotFound, code)
	code, _ = get(t, srv.URL+"/webhooks/nope")
	require.Equal(t, http.StatusBadRequest, code)
	code, _ = get(t, srv.URL+"/webhooks/"+b.orders.ID.String()+"?before=x")
	require.Equal(t, http.StatusBadRequest, code)
}

func TestWebhookDisableAsksFirstAndEnable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := webhookFixture(t)
	srv := b.serve(t, eventsui.Config{Prefix: "/outbox", Authorize: allowAll})
	base := srv.URL + "/outbox/webhooks/" + b.orders.ID.String()

	// The page links to the confirmation; it has no form that disables.
	_, body := get(t, base)
	require.Contains(t, body, `<a class="button danger" id="disable" href="/outbox/webhooks/`+b.orders.ID.String()+`/disable">`)
	require.NotContains(t, body, `action="/outbox/webhooks/`+b.orders.ID.String()+`/disable"`)
	require.NotContains(t, body, `id="enable"`, "it is enabled")

	code, body := get(t, base+"/disable")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<form method="post" action="/outbox/webhooks/`+b.orders.ID.String()+`/disable">`)
	require.Contains(t, body, "Disable deliveries to hooks.example.com?")
	require.Contains(t, body, "Orders &lt;script&gt;")
	require.Contains(t, body, `id="cancel" href="/outbox/webhooks/`+b.orders.ID.String()+`"`)
	require.True(t, b.get(t, b.orders.ID).Enabled, "the confirmation changes nothing")

	code, _ = get(t, base+"/enable")
	require.Equal(t, http.StatusMethodNotAllowed, code, "GET changes nothing")
	code, _ = postForm(t, base+"/disable", "cross-site", url.Values{"reason": {"x"}})
	require.Equal(t, http.StatusForbidden, code, "a cross-origin POST is refused")
	require.True(t, b.get(t, b.orders.ID).Enabled)

	// A pending delivery is cancelled by the disable.
	_, err := b.client.Insert(ctx, webhook.DeliverArgs{EndpointID: b.orders.ID, EventID: b.event, Type: "order.placed"}, nil)
	require.NoError(t, err)
	code, loc := postForm(t, base+"/disable", "same-origin", url.Values{"reason": {"rotating <b>certs</b>"}})
	require.Equal(t, http.StatusSeeOther, code)
	u, err := url.Parse(loc)
	require.NoError(t, err)
	require.Equal(t, "/outbox/webhooks/"+b.orders.ID.String(), u.Path)
	require.Equal(t, "Endpoint disabled; its pending deliveries are cancelled.", u.Query().Get("done"))
	e := b.get(t, b.orders.ID)
	require.False(t, e.Enabled)
	require.Equal(t, "rotating <b>certs</b>", e.DisabledReason)
	var state string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT state FROM river_job WHERE kind = 'webhook.deliver'`).Scan(&state))
	require.Equal(t, "cancelled", state)

	_, body = get(t, srv.URL+loc)
	require.Contains(t, body, `<span class="state poisoned" id="state">disabled</span>`)
	require.Contains(t, body, `<span class="error-text" id="reason">rotating &lt;b&gt;certs&lt;/b&gt;</span>`)
	require.Contains(t, body, `<button type="submit" id="enable">Enable</button>`)
	require.NotContains(t, body, `id="disable"`)
	require.NotContains(t, body, `id="replay"`, "no replay to a disabled endpoint")
	require.NotContains(t, body, `id="recover"`)

	code, _ = postForm(t, base+"/disable", "same-origin", url.Values{"reason": {strings.Repeat("x", 501)}})
	require.Equal(t, http.StatusBadRequest, code)

	code, _ = post(t, base+"/enable", "cross-site")
	require.Equal(t, http.StatusForbidden, code)
	require.False(t, b.get(t, b.orders.ID).Enabled)
	code, loc = post(t, base+"/enable", "same-origin")
	require.Equal(t, http.StatusSeeOther, code)
	require.Contains(t, loc, "done=Endpoint+enabled.")
	e = b.get(t, b.orders.ID)
	require.True(t, e.Enabled)
	require.Empty(t, e.DisabledReason)

	// An empty reason says who.
	code, _ = postForm(t, base+"/disable", "same-origin", url.Values{"reason": {"  "}})
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "disabled by an operator", b.get(t, b.orders.ID).DisabledReason)

	code, _ = post(t, srv.URL+"/outbox/webhooks/"+uuid.Must(uuid.NewV7()).String()+"/enable", "same-origin")
	require.Equal(t, http.StatusNotFound, code)
	code, _ = get(t, srv.URL+"/outbox/webhooks/"+uuid.Must(uuid.NewV7()).String()+"/disable")
	require.Equal(t, http.StatusNotFound, code)
}

func TestWebhookReplayAndRecover(t *testing.T) {
	t.Parallel()
	b := webhookFixture(t)
	srv := b.serve(t, eventsui.Config{Authorize: allowAll})
	base := srv.URL + "/webhooks/" + b.orders.ID.String()

	_, body := get(t, base)
	require.Contains(t, body, `<form method="post" class="filters" id="replay-form" action="/webhooks/`+b.orders.ID.String()+`/replay">`)
	require.Contains(t, body, `<form method="post" class="filters" id="recover-form" action="/webhooks/`+b.orders.ID.String()+`/recover">`)

	// Replay one event.
	code, _ := postForm(t, base+"/replay", "cross-site", url.Values{"event": {b.event.String()}})
	require.Equal(t, http.StatusForbidden, code)
	require.Zero(t, b.deliveries(t, b.orders.ID))
	code, loc := postForm(t, base+"/replay", "same-origin", url.Values{"event": {b.event.String()}})
	require.Equal(t, http.StatusSeeOther, code)
	u, err := url.Parse(loc)
	require.NoError(t, err)
	require.Equal(t, "Event "+b.event.String()+" queued for delivery again.", u.Query().Get("done"))
	require.Equal(t, 1, b.deliveries(t, b.orders.ID))

	code, _ = postForm(t, base+"/replay", "same-origin", url.Values{"event": {"nope"}})
	require.Equal(t, http.StatusBadRequest, code)
	code, _ = postForm(t, base+"/replay", "same-origin", url.Values{"event": {uuid.Must(uuid.NewV7()).String()}})
	require.Equal(t, http.StatusNotFound, code, "an event retention deleted")

	// Recover a range: the failure 10 minutes ago counts, the one 2 hours
	// ago does not.
	now := time.Now().UTC()
	form := url.Values{"from": {now.Add(-time.Hour).Format("2006-01-02T15:04")}, "to": {now.Add(time.Minute).Format("2006-01-02T15:04")}}
	code, _ = postForm(t, base+"/recover", "cross-site", form)
	require.Equal(t, http.StatusForbidden, code)
	require.Equal(t, 1, b.deliveries(t, b.orders.ID))
	code, loc = postForm(t, base+"/recover", "same-origin", form)
	require.Equal(t, http.StatusSeeOther, code)
	u, err = url.Parse(loc)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(u.Query().Get("done"), "1 deliveries queued"), u.Query().Get("done"))
	require.Equal(t, 2, b.deliveries(t, b.orders.ID))

	for _, bad := range []url.Values{
		{"from": {"yesterday"}, "to": form["to"]},
		{"from": form["to"], "to": form["from"]},
		{"from": form["from"]},
	} {
		code, _ = postForm(t, base+"/recover", "same-origin", bad)
		require.Equal(t, http.StatusBadRequest, code, bad)
	}

	// Not to a disabled endpoint: its worker would cancel them.
	require.NoError(t, b.wh.Disable(context.Background(), b.orders.ID, "off"))
	code, _ = postForm(t, base+"/replay", "same-origin", url.Values{"event": {b.event.String()}})
	require.Equal(t, http.StatusConflict, code)
	code, _ = postForm(t, base+"/recover", "same-origin", form)
	require.Equal(t, http.StatusConflict, code)

	// Without a River client, neither is offered.
	require.NoError(t, b.wh.Enable(context.Background(), b.orders.ID))
	noClient := serve(t, b.pool, eventsui.Config{Authorize: allowAll, Webhooks: b.wh})
	_, body = get(t, noClient.URL+"/webhooks/"+b.orders.ID.String())
	require.NotContains(t, body, `id="replay"`)
	require.NotContains(t, body, `id="recover"`)
	require.NotContains(t, body, "replay-row")
	require.Contains(t, body, `id="disable"`)
	code, _ = postForm(t, noClient.URL+"/webhooks/"+b.orders.ID.String()+"/replay", "same-origin", url.Values{"event": {b.event.String()}})
	require.Equal(t, http.StatusNotFound, code)
	require.Equal(t, 2, b.deliveries(t, b.orders.ID))
}

func TestWebhookButtonsAndActionsFollowAuthorize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := webhookFixture(t)
	require.NoError(t, b.wh.Disable(ctx, b.billing.ID, "off"))
	now := time.Now().UTC()
	forms := map[string]url.Values{
		"enable":  {},
		"disable": {"reason": {"r"}},
		"replay":  {"event": {b.event.String()}},
		"recover": {"from": {now.Add(-time.Hour).Format("2006-01-02T15:04")}, "to": {now.Add(time.Minute).Format("2006-01-02T15:04")}},
	}
	buttons := map[string]string{"enable": `id="enable"`, "disable": `id="disable"`, "replay": `id="replay"`, "recover": `id="recover"`}
	target := map[string]uuid.UUID{"enable": b.billing.ID, "disable": b.orders.ID, "replay": b.orders.ID, "recover": b.orders.ID}
	only := func(allowed eventsui.Action) eventsui.Config {
		return eventsui.Config{Authorize: func(_ *http.Request, a eventsui.Action) bool { return a == eventsui.ActionView || a == allowed }}
	}
	for _, tc := range []struct {
		name    string
		opts    eventsui.Config
		allowed string // the one action allowed; "" for none
	}{
		{"enable only", only(eventsui.ActionWebhookEnable), "enable"},
		{"disable only", only(eventsui.ActionWebhookDisable), "disable"},
		{"replay only", only(eventsui.ActionWebhookReplay), "replay"},
		{"recover only", only(eventsui.ActionWebhookRecover), "recover"},
		{"the event actions only", eventsui.Config{Authorize: func(_ *http.Request, a eventsui.Action) bool {
			return a == eventsui.ActionView || a == eventsui.ActionRequeue || a == eventsui.ActionDiscard
		}}, ""},
		{"read-only", eventsui.Config{Authorize: allowAll, ReadOnly: true}, ""},
	} {
		srv := b.serve(t, tc.opts)
		for action, button := range buttons {
			_, body := get(t, srv.URL+"/webhooks/"+target[action].String())
			require.Equal(t, action == tc.allowed, strings.Contains(body, button), "%s: %s", tc.name, action)
			if action == "replay" {
				require.Equal(t, action == tc.allowed, strings.Contains(body, "replay-row"), tc.name)
			}
			if action == tc.allowed {
				continue
			}
			code, _ := postForm(t, srv.URL+"/webhooks/"+target[action].String()+"/"+action, "same-origin", forms[action])
			require.Equal(t, http.StatusForbidden, code, "%s: %s", tc.name, action)
		}
		code, _ := get(t, srv.URL+"/webhooks/"+b.orders.ID.String()+"/disable")
		require.Equal(t, map[bool]int{true: http.StatusOK, false: http.StatusForbidden}[tc.allowed == "disable"], code, tc.name)
	}
	// Nothing changed.
	require.True(t, b.get(t, b.orders.ID).Enabled)
	require.False(t, b.get(t, b.billing.ID).Enabled)
	require.Zero(t, b.deliveries(t, b.orders.ID))

	// Refusals name the action.
	srv := b.serve(t, only(eventsui.ActionView))
	code, body := get(t, srv.URL+"/webhooks/"+b.orders.ID.String()+"/disable")
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "You may not disable webhook endpoints.")
	_, body = get(t, srv.URL+"/webhooks/"+b.orders.ID.String())
	require.NotContains(t, body, `class="actions"`, "no empty action bar")
}

// In a real browser, over real deliveries to a receiver on loopback that
// fails with a hostile answer: the endpoints page shows the failure rate
// and the breaker; the endpoint's page shows the attempt with the answer as
// text; the endpoint is disabled through the confirmation page, enabled
// again, and, once the receiver is fixed, the failed event is replayed and
// lands. Screenshots as in TestBrowserOperatorFlows.
func TestBrowserWebhookEndpoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := eventstest.Pool(t)

	var (
		fixed  atomic.Bool
		mu     sync.Mutex
		landed = map[string]int{} // webhook-id → 2xx answers
	)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { // loopback only
		_, _ = io.Copy(io.Discard, r.Body)
		if !fixed.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `<script>alert("pwned")</script> database is down`)
			return
		}
		mu.Lock()
		landed[r.Header.Get(webhook.HeaderID)]++
		mu.Unlock()
	}))
	defer receiver.Close()

	wh, err := webhook.New(pool, &webhook.Config{PlainSecrets: true,
		AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}})
	require.NoError(t, err)
	relay, err := events.NewRelay(pool, &events.RelayConfig{Listener: events.ListenerConfig{PollInterval: 100 * time.Millisecond}})
	require.NoError(t, err)
	require.NoError(t, relay.Subscribe(wh.Subscriber("webhooks")))
	workers := river.NewWorkers()
	require.NoError(t, wh.AddWorkers(workers))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}}, Workers: workers,
		FetchCooldown: 20 * time.Millisecond, FetchPollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	defer client.Stop(ctx)
	require.NoError(t, relay.Start(ctx, client))
	defer relay.Stop(ctx)

	ep, err := wh.Create(ctx, webhook.EndpointParams{URL: receiver.URL + "/hooks/orders?token=s3cret-token",
		Description: "Orders <b>service</b>", Types: []string{"order.*"}})
	require.NoError(t, err)
	var order events.Event
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		order, err = events.Record(ctx, tx, events.Event{Type: "order.placed", Subject: "order:1"})
		return err
	}))
	require.Eventually(t, func() bool {
		as, err := wh.Attempts(ctx, webhook.AttemptFilter{EndpointID: ep.ID})
		require.NoError(t, err)
		return len(as) > 0
	}, 20*time.Second, 20*time.Millisecond, "the first delivery fails")

	ui, err := eventsui.NewHandler(pool, &eventsui.Config{Prefix: "/outbox", Webhooks: wh, RiverClient: client,
		Authorize: func(*http.Request, eventsui.Action) bool { return true }})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/outbox/", ui)
	srv := httptest.NewServer(mux) // loopback only
	defer srv.Close()

	b := newBrowser(ctx, t, srv.URL)
	bctx := b.ctx
	scripts := func() int {
		nodes, err := chromedp.Run(bctx, chromedp.Nodes(chromedp.CSSAll("script"), chromedp.AtLeast(0)))
		require.NoError(t, err)
		return len(nodes)
	}
	row := `tr[data-endpoint="` + ep.ID.String() + `"]`

	// The endpoints page, from the navigation.
	b.do(chromedp.Navigate(srv.URL+"/outbox/"), chromedp.Click(chromedp.ID("nav-webhooks")), chromedp.WaitVisible(chromedp.CSS(row)))
	require.Equal(t, strings.TrimPrefix(receiver.URL, "http://"), b.text(row+" a.host"), "the host, with its port")
	require.Equal(t, "Orders <b>service</b>", b.text(row+" .description"), "markup shows as text")
	require.Equal(t, "enabled", b.text(row+" .endpoint-state"))
	require.Contains(t, b.text(row+" .success"), "0.0 %")
	require.NotContains(t, b.text("#endpoints"), "s3cret")
	b.screenshot("webhooks")

	// The endpoint's page: the failed attempt, its answer as text.
	b.do(chromedp.Click(chromedp.CSS(row+" a.host")), chromedp.WaitVisible(chromedp.ID("attempts")))
	require.Equal(t, "/hooks/orders", b.text("#path"))
	attempt := "#attempts tbody tr:last-child"
	require.Equal(t, "500", b.text(attempt+" .status"))
	require.Equal(t, "status", b.text(attempt+" .error-class"))
	require.Equal(t, "127.0.0.1", b.text(attempt+" .dialed"))
	require.Contains(t, b.text(attempt+" .response"), `<script>alert("pwned")</script> database is down`)
	require.Zero(t, scripts(), "the receiver's answer is text, not markup")
	require.NotContains(t, b.text("main"), "s3cret")
	b.screenshot("webhook-endpoint")

	// Disable, through its confirmation page.
	b.do(chromedp.Click(chromedp.ID("disable")), chromedp.WaitVisible(chromedp.ID("confirm")))
	require.Contains(t, b.text("#question"), "Disable deliveries to 127.0.0.1:")
	e, err := wh.Get(ctx, ep.ID)
	require.NoError(t, err)
	require.True(t, e.Enabled, "nothing happens before the confirmation")
	b.do(chromedp.SendKeys(chromedp.ID("reason"), "receiver down, ticket OPS-1"))
	b.screenshot("webhook-confirm-disable")
	b.do(chromedp.Click(chromedp.ID("confirm")), chromedp.WaitVisible(chromedp.CSS(".flash")))
	require.Equal(t, "disabled", b.text("#state"))
	require.Equal(t, "receiver down, ticket OPS-1", b.text("#reason"))
	b.screenshot("webhook-disabled")

	// Enable it, fix the receiver, replay the failed event.
	b.do(chromedp.Click(chromedp.ID("enable")), chromedp.WaitVisible(chromedp.ID("replay")))
	require.Equal(t, "enabled", b.text("#state"))
	fixed.Store(true)
	b.do(chromedp.SendKeys(chromedp.CSS(`#replay-form input[name="event"]`), order.ID.String()), chromedp.Click(chromedp.ID("replay")))
	// The page still shows the Enable's flash until the replay's answer
	// replaces it: wait for that one.
	want := "Event " + order.ID.String() + " queued for delivery again."
	require.Eventually(t, func() bool {
		got, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(".flash")))
		return err == nil && got == want
	}, 30*time.Second, 20*time.Millisecond, "the replay's flash")
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return landed[order.ID.String()] == 1
	}, 20*time.Second, 20*time.Millisecond, "the replay lands")
	b.reloadUntil("the replay's success", func() (bool, string) {
		s := b.text("#attempts tbody tr:first-child .status")
		return s == "200", s
	})
	b.screenshot("webhook-replayed")

	b.do(chromedp.Navigate(srv.URL + "/outbox/webhooks"))
	require.Contains(t, b.text(row+" .success"), "(1 of ", "the failures and the replay's success")
	b.screenshot("webhooks-after")
}
