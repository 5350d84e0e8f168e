// Command events is the operator's tool for the outbox of
// github.com/standmeet/events: migrations, stats, listing, inspecting,
// requeuing and discarding poisoned events or single deliveries (an event to
// one subscriber), the subscribers and relays, pausing a subscriber, the
// installed watches, and the webhook endpoints with their attempts.
//
//	go install github.com/standmeet/events/cmd/events@latest
//	events [--database-url URL] [--schema S] [--json] <command> [arguments]
//
// Commands:
//
//	migrate [--dry-run]            apply River's and the library's migrations (--dry-run prints the SQL)
//	migrate list                   the migrations, applied or not
//	stats [--watch N] [--orphan-after D]
//	                               pending, lag, retrying, poisoned, catching up, fanned out in the last minute,
//	                               owed and poisoned deliveries, paused and orphaned subscribers;
//	                               with --watch, again every N seconds until interrupted
//	list STATE [--type GLOB] [--subject S] [--limit N] [--after CURSOR]
//	                               STATE is pending, retrying, poisoned or recent
//	inspect ID                     one event: fields, payload, attempts, fanout, and the
//	                               deliveries it still owes or has poisoned, with their errors
//	requeue --event ID... [--type GLOB] [--subscriber S]
//	                               put poisoned events back in the queue: every poisoned delivery
//	                               of each (or only S's), or the event if poisoned as a whole
//	requeue --all-poisoned [--type GLOB] [--subscriber S] [--yes]
//	                               everything poisoned (of type GLOB; with --subscriber, only S's
//	                               deliveries), after confirming the count
//	discard --event ID... [--type GLOB] [--subscriber S]
//	discard --all-poisoned [--type GLOB] [--subscriber S] [--yes]
//	                               give poisoned deliveries, and events poisoned as a whole, up for good
//	deliveries [poisoned|owed] [--subscriber S] [--type GLOB] [--limit N] [--after CURSOR]
//	                               the deliveries (event, subscriber) poisoned or still owed
//	subscribers [--orphan-after D] the registry: state (active, paused, retired, ORPHANED), types,
//	                               owed, oldest owed, poisoned, last served and by which relay,
//	                               backfill progress; a warning for each orphan naming the fix
//	relays                         the relays of the last day: host, PID, version, subscribers,
//	                               running/stopped/dead, listening or polling, failures, last round
//	pause S, resume S              hold one subscriber's deliveries back, or let them go
//	watch list                     the installed table watches
//	webhooks [--limit N] [--after ID]
//	                               webhook endpoints: enabled or not and why, breaker, success
//	                               rate and latency (p50, p95) over the last hour
//	webhooks inspect ID [--limit N] [--failures] [--before N]
//	                               one endpoint and its recent attempts
//
// The webhooks commands print an endpoint's host (inspect adds its path),
// never its URL's query, a header value or a secret. They take
// --breaker-threshold N, the host's webhook Config.BreakerThreshold (5 by
// default), which decides whether a breaker reads open.
//
// The connection comes from --database-url or DATABASE_URL. Output is a
// table for people, or JSON with --json. Tables show control characters in
// subjects, types and errors as Go escapes (\x1b, \a), so recorded bytes
// cannot drive the terminal; JSON keeps them exactly. Exit codes: 0 success, 1 an error
// (on standard error), 2 a usage error.
package main

import (
	"context"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
