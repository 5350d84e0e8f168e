package bench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/standmeet/events"
	"github.com/standmeet/events/webhook"
)

// runWebhooks measures deliveries/s to a fast local receiver with 1, 10 and
// 100 endpoints; the same with secrets stored in clear (the ratio is what
// sealing costs) and with the cluster-wide rate limiter on, at a limit no
// run reaches (the ratio is what its UPDATE per delivery costs); and what
// signing and the address check cost per request.
func runWebhooks(ctx context.Context, h *harness, o Options, rep *Report) error {
	var got atomic.Int64
	receiver := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { got.Add(1) }))
	defer receiver.Close()
	for _, endpoints := range []int{1, 10, 100} {
		total := o.Deliveries
		sealed, err := deliveries(ctx, h, receiver.URL, endpoints, total/endpoints, &got, deliveryOpts{})
		if err != nil {
			return err
		}
		plain, err := deliveries(ctx, h, receiver.URL, endpoints, total/endpoints, &got, deliveryOpts{plain: true})
		if err != nil {
			return err
		}
		limited, err := deliveries(ctx, h, receiver.URL, endpoints, total/endpoints, &got, deliveryOpts{rateLimit: 1e6})
		if err != nil {
			return err
		}
		fmt.Fprintf(o.Log, "webhooks: %3d endpoint(s): %8.0f deliveries/s sealed, %8.0f in clear, %8.0f rate-limited\n",
			endpoints, sealed, plain, limited)
		rep.add("webhooks", fmt.Sprintf("deliveries/s, %d endpoint(s)", endpoints), sealed, "deliveries/s")
		rep.add("webhooks", fmt.Sprintf("deliveries/s, %d endpoint(s), secrets in clear", endpoints), plain, "deliveries/s")
		rep.add("webhooks", fmt.Sprintf("sealed ÷ clear, %d endpoint(s)", endpoints), sealed/plain, "ratio")
		rep.add("webhooks", fmt.Sprintf("deliveries/s, %d endpoint(s), rate limiter on", endpoints), limited, "deliveries/s")
		rep.add("webhooks", fmt.Sprintf("rate-limited ÷ unlimited, %d endpoint(s)", endpoints), limited/sealed, "ratio")
	}

	secret, body := webhook.NewSecret(), []byte(`{"type":"order.placed","timestamp":"2026-11-30T00:00:00Z","data":{"cents":1200}}`)
	n := 100_000
	start := time.Now()
	for range n {
		if _, err := webhook.Sign([]string{secret}, "01a22d0d-757d-7bfc-b99f-18b899a0045e", start, body); err != nil {
			return err
		}
	}
	rep.add("webhooks", "signing one delivery (one secret)", float64(time.Since(start).Nanoseconds())/float64(n)/1000, "µs")
	ip := netip.MustParseAddr("93.184.216.34")
	start = time.Now()
	for range n {
		if err := webhook.CheckAddress(ip); err != nil {
			return err
		}
	}
	rep.add("webhooks", "address check per dial", float64(time.Since(start).Nanoseconds())/float64(n)/1000, "µs")
	return nil
}

// benchKey seals the benchmark's endpoint secrets (zeros: a benchmark's,
// not a key to copy).
var benchKey = webhook.Key{ID: "bench", Key: make([]byte, 32)}

// deliveryOpts vary a deliveries run.
type deliveryOpts struct {
	plain     bool    // secrets in clear (Config.PlainSecrets, no keys)
	rateLimit float64 // EndpointParams.RateLimit
}

// deliveries records perEndpoint events to endpoints endpoints, each
// matching every event, and times until the receiver got them all.
func deliveries(ctx context.Context, h *harness, url string, endpoints, perEndpoint int, got *atomic.Int64, do deliveryOpts) (float64, error) {
	pool, err := h.database(ctx, 30)
	if err != nil {
		return 0, err
	}
	defer h.drop(ctx)
	defer pool.Close()
	cfg := &webhook.Config{Logger: quiet, AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, Keys: []webhook.Key{benchKey}}
	if do.plain {
		cfg.Keys, cfg.PlainSecrets = nil, true
	}
	wh, err := webhook.New(pool, cfg)
	if err != nil {
		return 0, err
	}
	for range endpoints {
		if _, err := wh.Create(ctx, webhook.EndpointParams{URL: url, Types: []string{"**"}, MaxInFlight: 50, RateLimit: do.rateLimit,
			SecretHeaders: map[string]string{"Authorization": "Bearer bench"}}); err != nil {
			return 0, err
		}
	}
	relay, err := events.NewRelay(pool, &events.RelayConfig{Logger: quiet})
	if err != nil {
		return 0, err
	}
	if err := relay.Subscribe(wh.Subscriber("webhooks")); err != nil {
		return 0, err
	}
	workers := river.NewWorkers()
	if err := wh.AddWorkers(workers); err != nil {
		return 0, err
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quiet, Workers: workers,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 50}}, FetchPollInterval: 20 * time.Millisecond, FetchCooldown: 5 * time.Millisecond})
	if err != nil {
		return 0, err
	}
	if err := client.Start(ctx); err != nil {
		return 0, err
	}
	defer client.Stop(ctx)
	if err := relay.Start(ctx, client); err != nil {
		return 0, err
	}
	defer relay.Stop(ctx)
	got.Store(0)
	want := int64(endpoints * perEndpoint)
	start := time.Now()
	es := make([]events.Event, perEndpoint)
	for i := range es {
		es[i] = events.Event{Type: "order.placed", Subject: fmt.Sprintf("order:%d", i), Payload: []byte(`{"cents":1200}`)}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := events.RecordMany(ctx, tx, es)
		return err
	}); err != nil {
		return 0, err
	}
	for got.Load() < want {
		if time.Since(start) > 5*time.Minute {
			return 0, fmt.Errorf("%d of %d deliveries after 5 minutes", got.Load(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return float64(want) / time.Since(start).Seconds(), nil
}
