package events_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/standmeet/events"
)

// A process that only works jobs: it builds no relay, and registers the
// handlers of its subscribers with the Outbox. Another process's relay
// (started here by startRelay) fans the events out.
func ExampleOutbox_AddWorkers() {
	ctx := context.Background()
	pool := examplePool()
	defer pool.Close()
	var outbox events.Outbox // the tables on the search_path
	mailer := func(handle func(context.Context, events.Event) error) events.Subscriber {
		return events.Subscriber{Name: "mailer", Types: []string{"order.*"}, Handle: handle}
	}
	// The relay's process: the same subscriber, its handler never called
	// there (its River client works no queue).
	_, stop := startRelay(pool, nil, mailer(func(context.Context, events.Event) error { return nil }))
	defer stop()

	// The worker's process.
	sent := make(chan string, 1)
	workers := river.NewWorkers()
	if err := outbox.AddWorkers(workers, pool, mailer(func(_ context.Context, e events.Event) error {
		sent <- e.Type + " " + e.Subject
		return nil
	})); err != nil {
		log.Fatal(err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Workers: workers, Logger: slog.New(slog.DiscardHandler),
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}}})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = client.Stop(ctx) }()

	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := events.Record(ctx, tx, events.Event{Type: "order.paid", Subject: "order:7"})
		return err
	}); err != nil {
		log.Fatal(err)
	}
	select {
	case s := <-sent:
		fmt.Println("mailed:", s)
	case <-time.After(30 * time.Second):
		fmt.Println("never handled")
	}
	// Output: mailed: order.paid order:7
}
