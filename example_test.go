package events_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/standmeet/events"
	"github.com/standmeet/events/eventstest"
)

// The whole loop: record an event in a write transaction, let the relay turn
// it into a River job, and handle it. README.md shows this same code.
func Example() {
	ctx := context.Background()
	pool := examplePool() // any *pgxpool.Pool on which outbox.Migrate has run
	defer pool.Close()

	// 1. A relay with one subscriber. Handle subscribers get a River job
	//    worked by the library's worker; Map subscribers get your own job args.
	relay, err := events.NewRelay(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	handled := make(chan events.Event, 1)
	err = relay.Subscribe(events.Subscriber{
		Name:     "search-index",
		Types:    []string{"note.*"},
		Coalesce: true, // the index re-reads the note: the latest change is enough
		Handle: func(ctx context.Context, e events.Event) error {
			handled <- e
			return nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}

	// 2. River as usual, plus the relay's worker.
	workers := river.NewWorkers()
	if err := relay.AddWorkers(workers); err != nil {
		log.Fatal(err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers: workers,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer client.Stop(ctx)
	if err := relay.Start(ctx, client); err != nil {
		log.Fatal(err)
	}
	defer relay.Stop(ctx)

	// 3. Record the event in the same transaction as the write it describes.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// … the application's own UPDATE goes here …
		_, err := events.Record(ctx, tx, events.Event{
			Type:    "note.changed",
			Subject: "note:42",
			Payload: []byte(`{"title":"Quarterly plan"}`),
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	select {
	case e := <-handled:
		fmt.Println("handled", e.Type, "for", e.Subject, string(e.Payload))
	case <-time.After(30 * time.Second):
		fmt.Println("timed out")
	}
	// Output: handled note.changed for note:42 {"title": "Quarterly plan"}
}

// examplePool returns a pool to a fresh, migrated database on the test
// server (see package eventstest). Its database is dropped with the server.
func examplePool() *pgxpool.Pool {
	pool, _, err := eventstest.NewPool(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	return pool
}
