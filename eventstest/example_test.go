package eventstest_test

import (
	"context"
	"fmt"
	"log"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/standmeet/events"
	"github.com/standmeet/events/eventstest"
)

// placeOrder is the application code under test: a write and its event.
func placeOrder(ctx context.Context, tx pgx.Tx, id int) error {
	_, err := events.Record(ctx, tx, events.Event{Type: "order.placed", Subject: fmt.Sprintf("order:%d", id)})
	return err
}

// A test asserts that the write path recorded its event, inside the
// transaction, without committing and without a relay.
func ExampleRequireRecordedTx() {
	ctx := context.Background()
	t := &testing.T{} // in a real test, the test's own *testing.T
	pool, closePool, err := eventstest.NewPool(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer closePool()

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := placeOrder(ctx, tx, 42); err != nil {
		log.Fatal(err)
	}
	e := eventstest.RequireRecordedTx(ctx, t, tx, events.Event{Type: "order.placed", Subject: "order:42"}, nil)
	eventstest.RequireNotRecordedTx(ctx, t, tx, "order.cancelled", nil)
	fmt.Println("recorded", e.Type, e.Subject)
	// Output: recorded order.placed order:42
}

type mailArgs struct {
	Order string `json:"order"`
}

func (mailArgs) Kind() string { return "mail.confirmation" }

// A test checks what jobs its subscribers make of an event, synchronously,
// in one transaction: no goroutines, no LISTEN, nothing left afterwards.
func ExampleFanoutTx() {
	ctx := context.Background()
	t := &testing.T{} // in a real test, the test's own *testing.T
	pool, closePool, err := eventstest.NewPool(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer closePool()
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{}) // insert-only
	if err != nil {
		log.Fatal(err)
	}
	relay, err := events.NewRelay(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	err = relay.Subscribe(events.Subscriber{Name: "mail", Types: []string{"order.placed"},
		Map: func(_ context.Context, e events.Event) (river.JobArgs, *river.InsertOpts, error) {
			return mailArgs{Order: e.Subject}, nil, nil
		}})
	if err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := placeOrder(ctx, tx, 7); err != nil {
		log.Fatal(err)
	}
	eventstest.FanoutTx(ctx, t, tx, relay, client)
	var kind, args string
	if err := tx.QueryRow(ctx, "SELECT kind, args::text FROM river_job").Scan(&kind, &args); err != nil {
		log.Fatal(err)
	}
	fmt.Println(kind, args)
	// Output: mail.confirmation {"order": "order:7"}
}
