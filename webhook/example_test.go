package webhook_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/standmeet/events"
	"github.com/standmeet/events/eventstest"
	"github.com/standmeet/events/webhook"
)

// Events out as signed webhooks: an endpoint, the relay's subscriber, the
// workers, and one event delivered to a receiver that verifies it.
func Example() {
	ctx := context.Background()
	pool, _, err := eventstest.NewPool(ctx) // any pool on which outbox.Migrate has run
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	var outbox events.Outbox // the tables on the search_path
	quiet := slog.New(slog.DiscardHandler)

	// The receiver; it verifies requests with webhook.Handler once the
	// endpoint's secret is known.
	received := make(chan string, 1)
	var verified atomic.Value // http.Handler
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		verified.Load().(http.Handler).ServeHTTP(w, r)
	}))
	defer receiver.Close()

	key := make([]byte, 32) // a real service loads its sealing key from a secret store
	_, _ = rand.Read(key)
	wh, err := webhook.New(pool, &webhook.Config{Outbox: outbox, Logger: quiet,
		Keys: []webhook.Key{{ID: "2026-12", Key: key}},
		// Deliveries dial only public addresses; this example's receiver is on loopback.
		AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	if err != nil {
		log.Fatal(err)
	}
	ep, err := wh.Create(ctx, webhook.EndpointParams{URL: receiver.URL + "/hooks", Types: []string{"order.*"}})
	if err != nil {
		log.Fatal(err)
	}
	verified.Store(webhook.Handler([]string{ep.Secrets[0].Secret}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		received <- string(body)
	})))

	relay, err := events.NewRelay(pool, &events.RelayConfig{Outbox: outbox, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Subscribe(wh.Subscriber("webhooks")); err != nil {
		log.Fatal(err)
	}
	workers := river.NewWorkers()
	if err := wh.AddWorkers(workers); err != nil {
		log.Fatal(err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quiet, Workers: workers,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}}, PeriodicJobs: wh.PeriodicJobs()})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = client.Stop(ctx) }()
	if err := relay.Start(ctx, client); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = relay.Stop(ctx) }()

	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := events.Record(ctx, tx, events.Event{Type: "order.placed", Subject: "order:1", Payload: []byte(`{"cents":1200}`)})
		return err
	}); err != nil {
		log.Fatal(err)
	}
	select {
	case body := <-received:
		// The body is {"type", "timestamp", "data"}.
		fmt.Println(strings.Contains(body, `"type":"order.placed"`), strings.Contains(body, `"data":{"cents":1200}`))
	case <-time.After(30 * time.Second):
		fmt.Println("no delivery")
	}
	// Output: true true
}

// A receiver's side: Handler passes on only requests signed with the
// endpoint's secret, and tells the next handler the delivery's ID, the same
// for every attempt, to do the work once.
func ExampleHandler() {
	secret := webhook.NewSecret()
	done := map[string]bool{}
	receiver := httptest.NewServer(webhook.Handler([]string{secret}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := webhook.DeliveryFrom(r.Context())
		if done[d.ID] {
			return // a retry of what was done: answer 2xx, do nothing
		}
		done[d.ID] = true
		body, _ := io.ReadAll(r.Body)
		fmt.Printf("delivery %s: %s\n", d.ID, body)
	})))
	defer receiver.Close()

	send := func(secret string) int {
		body := []byte(`{"type":"order.placed","timestamp":"2026-12-01T12:00:00Z","data":{}}`)
		now := time.Now()
		sig, err := webhook.Sign([]string{secret}, "evt_1", now, body)
		if err != nil {
			log.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodPost, receiver.URL, strings.NewReader(string(body)))
		req.Header.Set(webhook.HeaderID, "evt_1")
		req.Header.Set(webhook.HeaderTimestamp, fmt.Sprint(now.Unix()))
		req.Header.Set(webhook.HeaderSignature, sig)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	fmt.Println(send(secret))
	fmt.Println(send(secret))              // the same delivery again
	fmt.Println(send(webhook.NewSecret())) // signed with another secret
	// Output:
	// delivery evt_1: {"type":"order.placed","timestamp":"2026-12-01T12:00:00Z","data":{}}
	// 200
	// 200
	// 401
}
