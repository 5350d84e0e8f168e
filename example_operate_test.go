package events_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/standmeet/events"
)

// SearchArgs is an application's own River job.
type SearchArgs struct {
	Subject string `json:"subject"`
}

func (SearchArgs) Kind() string { return "search.reindex" }

// startRelay starts a relay with subs on pool, with an insert-only River
// client, and returns it and its stop function.
func startRelay(pool *pgxpool.Pool, config *events.RelayConfig, subs ...events.Subscriber) (*events.Relay, func()) {
	ctx := context.Background()
	if config == nil {
		config = &events.RelayConfig{}
	}
	config.Logger = slog.New(slog.DiscardHandler) // keep the examples' output clean
	relay, err := events.NewRelay(pool, config)
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range subs {
		if err := relay.Subscribe(s); err != nil {
			log.Fatal(err)
		}
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Start(ctx, client); err != nil {
		log.Fatal(err)
	}
	<-relay.Ready()
	return relay, func() { _ = relay.Stop(ctx) }
}

// A write receipt: after the commit, block until the event is River jobs.
func ExampleAwaiter_AwaitFanout() {
	ctx := context.Background()
	pool := examplePool()
	defer pool.Close()
	_, stop := startRelay(pool, nil, events.Subscriber{Name: "search", Types: []string{"note.*"},
		Map: func(_ context.Context, e events.Event) (river.JobArgs, *river.InsertOpts, error) {
			return SearchArgs{Subject: e.Subject}, nil, nil
		}})
	defer stop()

	awaiter, err := events.NewAwaiter(pool, nil) // one per process
	if err != nil {
		log.Fatal(err)
	}
	if err := awaiter.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer awaiter.Stop(ctx)

	var recorded events.Event
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		recorded, err = events.Record(ctx, tx, events.Event{Type: "note.changed", Subject: "note:7"})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	receipts, err := awaiter.AwaitFanout(waitCtx, recorded.ID)
	if err != nil {
		log.Fatal(err)
	}
	_, ok := receipts[0].Fanout["search"]
	fmt.Println("the search job exists:", ok)
	// Output: the search job exists: true
}

// A watch records events for writes that never pass through Go.
func ExampleOutbox_InstallWatch() {
	var outbox events.Outbox // the tables on the search_path
	ctx := context.Background()
	pool := examplePool()
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE invoices (id int PRIMARY KEY, status text NOT NULL);
		INSERT INTO invoices VALUES (9, 'open')`); err != nil {
		log.Fatal(err)
	}
	err := outbox.InstallWatch(ctx, pool, events.Watch{
		Table:          "invoices",
		Types:          map[events.Op]string{events.OpUpdate: "invoice.status.changed"},
		Columns:        []string{"status"}, // only when status really changes
		SubjectPrefix:  "invoice:",         // + the primary key
		Payload:        events.PayloadColumns,
		PayloadColumns: []string{"status"},
	})
	if err != nil {
		log.Fatal(err)
	}
	// Any SQL, in any transaction, now records events.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "UPDATE invoices SET status = 'paid' WHERE id = 9"); err != nil {
			return err
		}
		made, err := events.RecordedInTx(ctx, tx) // their IDs, for AwaitFanout
		for _, e := range made {
			fmt.Println(e.Type, e.Subject, string(e.Payload))
		}
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: invoice.status.changed invoice:9 {"status": "paid"}
}

// A subscriber whose Map keeps failing for an event is poisoned for that
// event alone (every other subscriber gets its job); once the cause is
// fixed an operator puts the delivery back in the queue.
func ExampleOutbox_Requeue() {
	var outbox events.Outbox // the tables on the search_path
	ctx := context.Background()
	pool := examplePool()
	defer pool.Close()
	var fixed atomic.Bool
	poisoned := make(chan events.Event, 1)
	_, stop := startRelay(pool, &events.RelayConfig{MaxAttempts: 1, OnPoison: func(_ context.Context, e events.Event, _ error) { poisoned <- e }},
		events.Subscriber{Name: "search", Types: []string{"**"},
			Map: func(_ context.Context, e events.Event) (river.JobArgs, *river.InsertOpts, error) {
				if !fixed.Load() {
					return nil, nil, errors.New("search index is read-only")
				}
				return SearchArgs{Subject: e.Subject}, nil, nil
			}})
	defer stop()

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := events.Record(ctx, tx, events.Event{Type: "note.changed", Subject: "note:3"})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	e := <-poisoned
	page, err := outbox.ListDeliveries(ctx, pool, events.ListDeliveriesParams{State: events.DeliveryPoisoned})
	if err != nil {
		log.Fatal(err)
	}
	d := page.Deliveries[0]
	fmt.Println("poisoned:", d.Subject, "for", d.Subscriber, "-", d.LastError)

	fixed.Store(true)
	filter := events.PoisonedFilter{EventIDs: []uuid.UUID{e.ID}, Subscriber: "search"}
	if _, err := outbox.Requeue(ctx, pool, filter); err != nil {
		log.Fatal(err)
	}
	for {
		info, err := outbox.GetEvent(ctx, pool, e.ID)
		if err != nil {
			log.Fatal(err)
		}
		if info.Fanout["search"] != 0 {
			fmt.Println("delivered to:", len(info.Fanout), "subscriber")
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Output:
	// poisoned: note:3 for search - subscriber "search": Map: search index is read-only
	// delivered to: 1 subscriber
}
