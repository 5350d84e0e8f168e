// Command quickstart shows the library end to end on a real PostgreSQL.
//
//	go run ./examples/quickstart
//
// With DATABASE_URL set it uses that database; otherwise it starts a
// throwaway PostgreSQL from the server binaries on the machine (as the tests
// do) and removes it on exit. It migrates, registers a coalescing and a
// non-coalescing subscriber, edits notes in write transactions that record
// events, runs River workers, prints what was fanned out and handled, and
// exits 0.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/standmeet/events"
	"github.com/standmeet/events/eventstest"
)

// WebhookArgs is the application's own job: the "webhooks" subscriber maps
// every note event to one, and the application's worker sends it.
type WebhookArgs struct {
	EventID string `json:"event_id"`
	Type    string `json:"type"`
	Subject string `json:"subject"`
}

func (WebhookArgs) Kind() string { return "webhook.deliver" }

type webhookWorker struct {
	river.WorkerDefaults[WebhookArgs]
	done func(WebhookArgs)
}

func (w *webhookWorker) Work(ctx context.Context, job *river.Job[WebhookArgs]) error {
	w.done(job.Args) // a real one would POST and return an error on non-2xx
	return nil
}

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
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
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS quickstart_notes (id int PRIMARY KEY, title text NOT NULL);
		INSERT INTO quickstart_notes VALUES (1, 'Plan'), (2, 'Budget') ON CONFLICT (id) DO UPDATE SET title = excluded.title`); err != nil {
		return err
	}

	var (
		mu       sync.Mutex
		log      []string
		webhooks int
		reindex  int
		finished = make(chan struct{})
	)
	note := func(line string, isWebhook bool) {
		mu.Lock()
		defer mu.Unlock()
		log = append(log, line)
		if isWebhook {
			webhooks++
		} else {
			reindex++
		}
		if webhooks == 3 && reindex == 2 {
			close(finished)
		}
	}

	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	relay, err := events.NewRelay(pool, &events.RelayConfig{Logger: quiet})
	if err != nil {
		return err
	}
	// Coalescing: the search index re-reads the note, so one job per note per
	// batch, for its latest event, is enough.
	if err := relay.Subscribe(events.Subscriber{
		Name: "search-index", Types: []string{"note.*"}, Coalesce: true,
		Handle: func(ctx context.Context, e events.Event) error {
			note(fmt.Sprintf("search-index  reindexed %s (latest event: %s)", e.Subject, e.Type), false)
			return nil
		},
	}); err != nil {
		return err
	}
	// Not coalescing: every event is a fact to deliver.
	if err := relay.Subscribe(events.Subscriber{
		Name: "webhooks", Types: []string{"note.**"},
		Map: func(ctx context.Context, e events.Event) (river.JobArgs, *river.InsertOpts, error) {
			return WebhookArgs{EventID: e.ID.String(), Type: e.Type, Subject: e.Subject}, nil, nil
		},
	}); err != nil {
		return err
	}

	workers := river.NewWorkers()
	if err := relay.AddWorkers(workers); err != nil {
		return err
	}
	river.AddWorker(workers, &webhookWorker{done: func(a WebhookArgs) {
		note(fmt.Sprintf("webhooks      delivered %s for %s", a.Type, a.Subject), true)
	}})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Logger:  quiet,
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers: workers,
	})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer client.Stop(context.WithoutCancel(ctx))
	if err := relay.Start(ctx, client); err != nil {
		return err
	}
	defer relay.Stop(context.WithoutCancel(ctx))

	// One write transaction: two edits of note 1 and one of note 2, each
	// recorded with the write it describes. They commit (or vanish) together.
	var recorded []events.Event
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		edits := []struct {
			id    int
			title string
			typ   string
		}{
			{1, "Plan v2", "note.changed"},
			{2, "Budget 2027", "note.changed"},
			{1, "Plan (final)", "note.renamed"},
		}
		for _, ed := range edits {
			if _, err := tx.Exec(ctx, "UPDATE quickstart_notes SET title = $2 WHERE id = $1", ed.id, ed.title); err != nil {
				return err
			}
			payload, _ := json.Marshal(map[string]string{"title": ed.title})
			e, err := events.Record(ctx, tx, events.Event{Type: ed.typ, Subject: fmt.Sprintf("note:%d", ed.id), Payload: payload})
			if err != nil {
				return err
			}
			recorded = append(recorded, e)
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Printf("recorded %d events in one write transaction\n", len(recorded))

	select {
	case <-finished:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("timed out: %d webhooks and %d reindexes handled", webhooks, reindex)
	}
	mu.Lock()
	sort.Strings(log)
	for _, l := range log {
		fmt.Println(l)
	}
	mu.Unlock()

	fmt.Println("fanout (subscriber → River job ID) stored on each event:")
	for _, e := range recorded {
		var fanout string
		if err := pool.QueryRow(ctx, "SELECT fanout::text FROM outbox_events WHERE id = $1", e.ID).Scan(&fanout); err != nil {
			return err
		}
		fmt.Printf("  seq %d %-13s %s  %s\n", e.Seq, e.Type, e.Subject, fanout)
	}
	fmt.Println("done")
	return nil
}
