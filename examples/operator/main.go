// Command operator serves River UI and the outbox's web view (package
// eventsui) side by side on one local server, over a database where one
// event is poisoned, ready to be requeued from the browser.
//
//	go run ./examples/operator            # then open http://127.0.0.1:8080/outbox/
//	go run ./examples/operator -addr 127.0.0.1:9000
//
// With DATABASE_URL set it uses that database; otherwise a throwaway
// PostgreSQL, removed on exit (Ctrl-C). The "search" subscriber refuses
// events until you requeue one from the page: requeuing fixes it, so the
// requeued event is fanned out and its job shows in River UI.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"riverqueue.com/riverui"

	"github.com/standmeet/events"
	"github.com/standmeet/events/eventstest"
	"github.com/standmeet/events/eventsui"
)

// ReindexArgs is the application's own job for the "search" subscriber.
type ReindexArgs struct {
	Subject string `json:"subject"`
}

func (ReindexArgs) Kind() string { return "search.reindex" }

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address (keep it on loopback: the demo authorizes everyone)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *addr); err != nil {
		fmt.Fprintln(os.Stderr, "operator:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, addr string) error {
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
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	// A relay whose "search" subscriber fails until the first requeue.
	var fixed atomic.Bool
	relay, err := events.NewRelay(pool, &events.RelayConfig{MaxAttempts: 1, Logger: logger})
	if err != nil {
		return err
	}
	if err := relay.Subscribe(events.Subscriber{Name: "search", Types: []string{"note.*"},
		Map: func(_ context.Context, e events.Event) (river.JobArgs, *river.InsertOpts, error) {
			if !fixed.Load() {
				return nil, nil, errors.New("search index is read-only (requeue the event to fix it)")
			}
			return ReindexArgs{Subject: e.Subject}, nil, nil
		}}); err != nil {
		return err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[ReindexArgs]) error { return nil }))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: logger, Workers: workers,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 5}}})
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

	// One event, poisoned at its first attempt.
	var poisoned events.Event
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		poisoned, err = events.Record(ctx, tx, events.Event{Type: "note.changed", Subject: "note:42", Payload: []byte(`{"title":"Quarterly plan"}`)})
		return err
	}); err != nil {
		return err
	}
	for {
		info, err := outbox.GetEvent(ctx, pool, poisoned.ID)
		if err != nil {
			return err
		}
		if info.Poisoned() {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	fixed.Store(true) // the next attempt, after a requeue, succeeds

	// River UI and the outbox view on one server.
	ui, err := riverui.NewHandler(&riverui.HandlerOpts{Endpoints: riverui.NewEndpoints(client, nil), Logger: logger, Prefix: "/riverui"})
	if err != nil {
		return err
	}
	if err := ui.Start(ctx); err != nil {
		return err
	}
	view, err := eventsui.NewHandler(pool, &eventsui.Config{
		Outbox:     outbox,
		Prefix:     "/outbox",
		RiverUIURL: "/riverui",
		// A demo on loopback: everyone may do everything. A real host checks
		// its own session here.
		Authorize: func(*http.Request, eventsui.Action) bool { return true },
	})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/riverui/", ui)
	mux.Handle("/outbox/", view)
	mux.Handle("/{$}", http.RedirectHandler("/outbox/", http.StatusFound))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	fmt.Printf("the outbox: http://%s/outbox/\nRiver UI:   http://%s/riverui/\npoisoned:   http://%s/outbox/events/%s\nCtrl-C to stop.\n",
		ln.Addr(), ln.Addr(), ln.Addr(), poisoned.ID)
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
