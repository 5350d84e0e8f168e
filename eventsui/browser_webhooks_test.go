package eventsui_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/eventstest"
	"github.com/standmeet/events/eventsui"
	"github.com/standmeet/events/webhook"
)

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
	}, 10*time.Second, 20*time.Millisecond, "the replay's flash")
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
