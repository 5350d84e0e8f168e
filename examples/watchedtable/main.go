// Command watchedtable shows events recorded by a table trigger, for writes
// that never pass through Go.
//
//	go run ./examples/watchedtable
//
// It installs a watch on a corpus_notes table (UPDATE of title or body records
// corpus.note.changed, DELETE records corpus.note.deleted), writes with plain
// SQL as psql or another service would, finds the trigger-made events of its
// own transaction with events.RecordedInTx, waits for their write receipts,
// and prints them. DATABASE_URL is used when set; otherwise a throwaway
// PostgreSQL is started from the server binaries on the machine.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/standmeet/events"
	"github.com/standmeet/events/eventstest"
)

// ReindexArgs is the application's own job for the search index.
type ReindexArgs struct {
	Subject string `json:"subject"`
}

func (ReindexArgs) Kind() string { return "search.reindex" }

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "watchedtable:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	// The library\'s handle: its tables on the search_path (set Schema for
	// a schema of their own, in River\'s config too).
	var outbox events.Outbox
	// DATABASE_URL, or a throwaway PostgreSQL removed on exit.
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
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS corpus_notes;
		CREATE TABLE corpus_notes (id int PRIMARY KEY, title text NOT NULL, body text NOT NULL, views int NOT NULL DEFAULT 0);
		INSERT INTO corpus_notes VALUES (1, 'Plan', 'draft', 0), (2, 'Budget', 'draft', 0), (3, 'Old', 'stale', 0)`); err != nil {
		return err
	}

	// The watch: changes of title or body (not views) and deletes.
	if err := outbox.InstallWatch(ctx, pool, events.Watch{
		Table:          "corpus_notes",
		Types:          map[events.Op]string{events.OpUpdate: "corpus.note.changed", events.OpDelete: "corpus.note.deleted"},
		Columns:        []string{"title", "body"},
		SubjectPrefix:  "note:", // + the primary key
		Payload:        events.PayloadColumns,
		PayloadColumns: []string{"title"},
	}); err != nil {
		return err
	}
	fmt.Println("installed a watch on corpus_notes (UPDATE OF title, body; DELETE)")

	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	relay, err := events.NewRelay(pool, &events.RelayConfig{Logger: quiet})
	if err != nil {
		return err
	}
	if err := relay.Subscribe(events.Subscriber{
		Name: "search-index", Types: []string{"corpus.note.*"}, Coalesce: true,
		Map: func(ctx context.Context, e events.Event) (river.JobArgs, *river.InsertOpts, error) {
			return ReindexArgs{Subject: e.Subject}, nil, nil
		},
	}); err != nil {
		return err
	}
	// An insert-only River client is enough for the relay; the workers of
	// search.reindex would run wherever the application runs them.
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quiet})
	if err != nil {
		return err
	}
	if err := relay.Start(ctx, client); err != nil {
		return err
	}
	defer relay.Stop(context.WithoutCancel(ctx))
	awaiter, err := events.NewAwaiter(pool, &events.AwaiterConfig{Logger: quiet})
	if err != nil {
		return err
	}
	if err := awaiter.Start(ctx); err != nil {
		return err
	}
	defer awaiter.Stop(context.WithoutCancel(ctx))

	// Plain SQL, as psql or another service would write. Only the triggers
	// know about events.
	var made []events.Event
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, sql := range []string{
			"UPDATE corpus_notes SET views = views + 10",               // unwatched column: no event
			"UPDATE corpus_notes SET title = title",                    // no real change: no event
			"UPDATE corpus_notes SET body = 'final' WHERE id <= 2",     // two events
			"UPDATE corpus_notes SET title = 'Plan (v2)' WHERE id = 1", // a second one for note:1
			"DELETE FROM corpus_notes WHERE id = 3",                    // one event
		} {
			if _, err := tx.Exec(ctx, sql); err != nil {
				return err
			}
		}
		var err error
		made, err = events.RecordedInTx(ctx, tx) // the IDs, for receipts
		return err
	})
	if err != nil {
		return err
	}
	fmt.Printf("the triggers recorded %d events in the writing transaction\n", len(made))
	ids := make([]uuid.UUID, len(made))
	for i, e := range made {
		ids[i] = e.ID
	}
	receipts, err := awaiter.AwaitFanout(ctx, ids...)
	if err != nil {
		return err
	}
	for i, e := range made {
		fmt.Printf("  %-20s %-7s %-22s → search-index job %d\n", e.Type, e.Subject, string(e.Payload), receipts[i].Fanout["search-index"])
	}
	fmt.Println("note:1's two changes share one job: the search index coalesces.")
	return nil
}
