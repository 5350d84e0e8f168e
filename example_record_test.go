package events_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/standmeet/events"
)

// Record an event in the same transaction as the write it describes: both
// commit, or neither does.
func ExampleRecord() {
	ctx := context.Background()
	pool := examplePool()
	defer pool.Close()

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// … the application's own write goes here …
		e, err := events.Record(ctx, tx, events.Event{
			Type:    "invoice.paid",
			Subject: "invoice:9",
			Payload: []byte(`{"cents":1200}`),
		})
		if err != nil {
			return err
		}
		fmt.Println("recorded", e.Type, e.Subject, "version", e.ID.Version())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}

	// Bad input is refused before anything is sent, naming the field; the
	// transaction stays usable.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := events.Record(ctx, tx, events.Event{Type: "invoice paid"})
		var invalid *events.ValidationError
		if errors.As(err, &invalid) {
			fmt.Println("refused:", invalid.Field)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// recorded invoice.paid invoice:9 version VERSION_7
	// refused: Type
}

// RecordMany records many events in one round trip; all or none are
// accepted.
func ExampleRecordMany() {
	ctx := context.Background()
	pool := examplePool()
	defer pool.Close()

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		recorded, err := events.RecordMany(ctx, tx, []events.Event{
			{Type: "order.placed", Subject: "order:1"},
			{Type: "order.placed", Subject: "order:2"},
		})
		for _, e := range recorded {
			fmt.Println(e.Type, e.Subject)
		}
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// order.placed order:1
	// order.placed order:2
}
