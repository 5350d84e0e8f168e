// Command webhooks sends events out as signed webhooks to a local receiver
// that verifies every signature: one endpoint answers 503 at first and then
// recovers; the attempt log is printed at the end.
//
//	go run ./examples/webhooks
//
// With DATABASE_URL set it uses that database; otherwise a throwaway
// PostgreSQL, removed on exit. Deliveries may only reach public addresses;
// this demo opens loopback (Config.AllowedNetworks) for its own receiver.
package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/standmeet/events"
	"github.com/standmeet/events/eventstest"
	"github.com/standmeet/events/webhook"
)

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "webhooks:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	// The library\'s handle: its tables on the search_path (set Schema for
	// a schema of their own, in River\'s config too).
	var outbox events.Outbox
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		pg, err := eventstest.StartPostgres(ctx)
		if err != nil {
			return err
		}
		defer pg.Close()
		url = pg.URL("postgres")
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		return err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	// The receiver: it verifies each delivery with the endpoint's secret.
	// The first two deliveries to /flaky get 503 with Retry-After: 1.
	var secrets = map[string]string{}
	var flaky atomic.Int32
	received := make(chan string, 10)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := webhook.Verify(secrets[r.URL.Path], r.Header, body); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if r.URL.Path == "/flaky" && flaky.Add(1) <= 2 {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "warming up", http.StatusServiceUnavailable)
			return
		}
		received <- fmt.Sprintf("%-7s verified %s %s", r.URL.Path, r.Header.Get(webhook.HeaderID), body)
	}))
	defer receiver.Close()

	// Endpoint secrets are sealed at rest under the host's keys; a real
	// service loads its key from a secret store, never from the database.
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	wh, err := webhook.New(pool, &webhook.Config{Logger: quiet,
		Keys:            []webhook.Key{{ID: "example-1", Key: key}},
		AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	if err != nil {
		return err
	}
	for path, types := range map[string][]string{"/orders": {"order.*"}, "/flaky": {"**"}} {
		ep, err := wh.Create(ctx, webhook.EndpointParams{URL: receiver.URL + path, Types: types, Description: path})
		if err != nil {
			return err
		}
		secrets[path] = ep.Secrets[0].Secret
	}

	relay, err := events.NewRelay(pool, &events.RelayConfig{Logger: quiet})
	if err != nil {
		return err
	}
	if err := relay.Subscribe(wh.Subscriber("webhooks")); err != nil {
		return err
	}
	workers := river.NewWorkers()
	if err := wh.AddWorkers(workers); err != nil {
		return err
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quiet, Workers: workers,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}}, PeriodicJobs: wh.PeriodicJobs()})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer client.Stop(ctx)
	if err := relay.Start(ctx, client); err != nil {
		return err
	}
	defer relay.Stop(ctx)

	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := events.RecordMany(ctx, tx, []events.Event{
			{Type: "order.placed", Subject: "order:1", Payload: []byte(`{"cents":1200}`)},
			{Type: "note.changed", Subject: "note:7", Payload: []byte(`{"title":"Plan"}`)},
		})
		return err
	}); err != nil {
		return err
	}
	// order.placed goes to /orders and /flaky, note.changed to /flaky: three
	// deliveries, two of them after /flaky recovers.
	for range 3 {
		select {
		case line := <-received:
			fmt.Println(line)
		case <-time.After(30 * time.Second):
			return fmt.Errorf("a delivery never arrived")
		}
	}
	// The receiver answered; the attempts are logged right after.
	var attempts []webhook.Attempt
	for deadline := time.Now().Add(10 * time.Second); ; {
		if attempts, err = wh.Attempts(ctx, webhook.AttemptFilter{Limit: 20}); err != nil {
			return err
		}
		if len(attempts) >= 5 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Println("attempt log, newest first:")
	for _, a := range attempts {
		outcome := "delivered"
		if a.ErrorClass != "" {
			outcome = a.ErrorClass + ": " + a.Error
		}
		fmt.Printf("  event %s attempt %d → %d %s (%v, %s)\n", a.EventID, a.Attempt, a.Status, outcome, a.Duration.Round(time.Millisecond), a.DialedIP)
	}
	return nil
}
