package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/glob"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// usageError is a mistake in the command line: exit code 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

const usage = `usage: events [--database-url URL] [--schema S] [--json] <command> [arguments]

commands:
  migrate [--dry-run]        apply River's and the library's migrations
  migrate list               the migrations, applied or not
  stats [--watch N] [--orphan-after D]
                             pending, lag, retrying, poisoned, fanned out in the last minute,
                             owed and poisoned deliveries, paused and orphaned subscribers
                             (--watch: again every N seconds until interrupted)
  list STATE [--type GLOB] [--subject S] [--limit N] [--after CURSOR]
                             STATE: pending, retrying, poisoned or recent
  inspect ID                 one event in full, with its owed and poisoned deliveries and their errors
  requeue --event ID... [--type GLOB] [--subscriber S]
                             put poisoned events back in the queue: each event's poisoned deliveries
                             (only S's with --subscriber), or the event if poisoned as a whole
  requeue --all-poisoned [--type GLOB] [--subscriber S] [--yes]
                             everything poisoned (of type GLOB; with --subscriber, S's deliveries only),
                             after confirming the count
  discard --event ID... [--type GLOB] [--subscriber S]
  discard --all-poisoned [--type GLOB] [--subscriber S] [--yes]
                             give poisoned deliveries, and events poisoned as a whole, up for good
  deliveries [poisoned|owed] [--subscriber S] [--type GLOB] [--limit N] [--after CURSOR]
                             the deliveries (event, subscriber) poisoned (default) or still owed
  subscribers [--orphan-after D]
                             the registry: state, owed, oldest owed, poisoned, last served and by
                             which relay, backfill; orphaned ones (unserved for D, 15m) are warned of
  relays                     the relays of the last day: host, PID, version, subscribers, running,
                             stopped or dead, listening or polling, failures, last round
  pause S / resume S         hold subscriber S's deliveries back (they stay owed), or let them go
  chains [--blocked] [--subscriber S] [--limit N] [--after CURSOR]
                             ordered subscribers' subjects with jobs waiting: the head job, River's state
                             of it, how many wait behind it, and whether it is BLOCKED (its job discarded,
                             cancelled or deleted)
  chains resume S SUBJECT    retry a blocked subject's head; the jobs behind it follow once it succeeds
  chains skip S SUBJECT      give a blocked subject's head up; the next job of the subject runs
  watch list                 the installed table watches
  webhooks [--limit N] [--after ID]
                             webhook endpoints: state, breaker, success and latency over the last hour
  webhooks inspect ID [--limit N] [--failures] [--before N]
                             one endpoint and its recent attempts
                             (both take --breaker-threshold N: the host's Config.BreakerThreshold, default 5)

The connection comes from --database-url or DATABASE_URL.
`

// cli is one invocation.
type cli struct {
	ctx    context.Context
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	json   bool
	outbox events.Outbox
	pool   *pgxpool.Pool
	// after is time.After; tests replace it to run a watch without waiting.
	after func(time.Duration) <-chan time.Time
}

// Widths, in runes, of the long columns of tables: longer values end in
// "…". (inspect prints them whole.)
const (
	subjectWidth = 40
	errorWidth   = 60
)

// run runs the command line args and returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return (&cli{ctx: ctx, stdin: stdin, stdout: stdout, stderr: stderr, after: time.After}).exit(args)
}

// exit runs args and reports the outcome: the exit code, and any error on
// standard error.
func (c *cli) exit(args []string) int {
	stdout, stderr := c.stdout, c.stderr
	err := c.run(args)
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, usage)
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "%s\n\n%s", errorLine(err), usage)
		return exitUsage
	default:
		fmt.Fprintln(stderr, errorLine(err))
		return exitError
	}
}

// errorLine is err as the CLI prints it: prefixed with the program's name
// once (the library's errors already start with "events: "), and cleaned, as
// an error may quote a subject or an event's last error.
func errorLine(err error) string {
	msg := err.Error()
	if !strings.HasPrefix(msg, "events: ") {
		msg = "events: " + msg
	}
	return clean(msg)
}

func (c *cli) run(args []string) error {
	global := flag.NewFlagSet("events", flag.ContinueOnError)
	global.SetOutput(io.Discard)
	dbURL := global.String("database-url", os.Getenv("DATABASE_URL"), "")
	global.StringVar(&c.outbox.Schema, "schema", "", "")
	global.BoolVar(&c.json, "json", false, "")
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usagef("%v", err)
	}
	rest := global.Args()
	if len(rest) == 0 {
		return usagef("no command")
	}
	cmd, rest := rest[0], rest[1:]
	commands := map[string]func([]string) error{
		"migrate": c.migrate, "stats": c.stats, "list": c.list, "inspect": c.inspect,
		"requeue": c.requeue, "discard": c.discard, "watch": c.watch, "subscribers": c.subscribers,
		"webhooks": c.webhooks, "relays": c.relays, "deliveries": c.deliveries, "pause": c.pause, "resume": c.resume,
		"chains": c.chains,
	}
	f, ok := commands[cmd]
	if !ok {
		if cmd == "help" {
			return flag.ErrHelp
		}
		return usagef("unknown command %q", cmd)
	}
	if *dbURL == "" {
		return usagef("no database: set --database-url or DATABASE_URL")
	}
	cfg, err := pgxpool.ParseConfig(*dbURL)
	if err != nil {
		return usagef("--database-url: %v", err)
	}
	cfg.MaxConns = 2
	if c.pool, err = pgxpool.NewWithConfig(c.ctx, cfg); err != nil {
		return err
	}
	defer c.pool.Close()
	return f(rest)
}

// flags parses a command's own flags; positional arguments may come before
// or after them.
func flags(name string, args []string, define func(*flag.FlagSet)) ([]string, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	define(fs)
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, usagef("%s: %v", name, err)
		}
		if fs.NArg() == 0 {
			return positional, nil
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// output writes v as JSON with --json, or calls table otherwise.
func (c *cli) output(v any, table func(w *tabwriter.Writer)) error {
	if c.json {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	table(w)
	return w.Flush()
}

func (c *cli) migrate(args []string) error {
	var dryRun bool
	pos, err := flags("migrate", args, func(fs *flag.FlagSet) { fs.BoolVar(&dryRun, "dry-run", false, "") })
	if err != nil {
		return err
	}
	switch {
	case len(pos) == 1 && pos[0] == "list":
		all, err := c.outbox.ListMigrations(c.ctx, c.pool)
		if err != nil {
			return err
		}
		type row struct {
			Line    string `json:"line"`
			Version int    `json:"version"`
			Name    string `json:"name"`
			Applied bool   `json:"applied"`
		}
		rows := make([]row, len(all))
		for i, m := range all {
			rows[i] = row{m.Line, m.Version, m.Name, m.Applied}
		}
		return c.output(rows, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "LINE\tVERSION\tNAME\tAPPLIED")
			for _, r := range rows {
				fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", r.Line, r.Version, clean(r.Name), yesNo(r.Applied))
			}
		})
	case len(pos) > 0:
		return usagef("migrate: unexpected %q", pos[0])
	case dryRun:
		all, err := c.outbox.ListMigrations(c.ctx, c.pool)
		if err != nil {
			return err
		}
		pending := slices.DeleteFunc(all, func(m events.MigrationInfo) bool { return m.Applied })
		if c.json {
			return c.output(pending, nil)
		}
		if len(pending) == 0 {
			fmt.Fprintln(c.stdout, "-- nothing to apply")
		}
		for _, m := range pending {
			fmt.Fprintf(c.stdout, "-- %s %03d %s\n%s\n\n", m.Line, m.Version, m.Name, strings.TrimSpace(m.SQL))
		}
		return nil
	}
	if err := c.outbox.Migrate(c.ctx, c.pool); err != nil {
		return err
	}
	if c.json {
		return c.output(map[string]bool{"migrated": true}, nil)
	}
	fmt.Fprintln(c.stdout, "migrated")
	return nil
}

// statsJSON is Stats as --json prints it.
type statsJSON struct {
	Pending             int64   `json:"pending"`
	LagSeconds          float64 `json:"lag_seconds"`
	Retrying            int64   `json:"retrying"`
	Poisoned            int64   `json:"poisoned"`
	CatchingUp          int64   `json:"catching_up"`
	FannedOutLastMinute int64   `json:"fanned_out_last_minute"`
	// The deliveries still owed and poisoned, and the
	// subscribers orphaned and paused.
	Owed               int64    `json:"owed"`
	PoisonedDeliveries int64    `json:"poisoned_deliveries"`
	Orphaned           []string `json:"orphaned"`
	Paused             []string `json:"paused"`
	// The subjects of ordered subscribers that are blocked.
	BlockedChains int64 `json:"blocked_chains"`
}

func (c *cli) stats(args []string) error {
	var every float64
	pos, err := flags("stats", args, func(fs *flag.FlagSet) {
		fs.Float64Var(&every, "watch", 0, "")
		fs.DurationVar(&c.outbox.OrphanAfter, "orphan-after", events.OrphanAfterDefault, "")
	})
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("stats: unexpected %q", pos[0])
	}
	if every == 0 {
		return c.statsOnce(false)
	}
	if every < 0.1 {
		return usagef("stats: --watch takes seconds, at least 0.1")
	}
	// Until interrupted (main cancels ctx on Ctrl-C): an interrupt is how a
	// watch ends, so it is no error, even in the middle of a query.
	interval := time.Duration(every * float64(time.Second))
	for {
		if err := c.statsOnce(true); err != nil {
			if c.ctx.Err() != nil {
				return nil
			}
			return err
		}
		select {
		case <-c.ctx.Done():
			return nil
		case <-c.after(interval):
		}
	}
}

// statsOnce prints Stats once; in a watch, each table is headed by the time
// it was read, and each JSON object is one line (JSON Lines).
func (c *cli) statsOnce(watching bool) error {
	st, err := c.outbox.GetStats(c.ctx, c.pool)
	if err != nil {
		return err
	}
	v := statsJSON{st.Pending, st.Lag.Seconds(), st.Retrying, st.Poisoned, st.CatchingUp, st.FannedOutLastMinute,
		st.Owed, st.PoisonedDeliveries, nonNil(st.Orphaned), nonNil(st.Paused), st.BlockedChains}
	if watching && c.json {
		return json.NewEncoder(c.stdout).Encode(v)
	}
	return c.output(v, func(w *tabwriter.Writer) {
		if watching {
			fmt.Fprintf(w, "-- %s\n", time.Now().UTC().Format(time.RFC3339))
		}
		fmt.Fprintf(w, "pending\t%d\n", st.Pending)
		fmt.Fprintf(w, "lag\t%s\n", st.Lag.Round(time.Millisecond))
		fmt.Fprintf(w, "retrying\t%d\n", st.Retrying)
		fmt.Fprintf(w, "poisoned\t%d\n", st.Poisoned)
		fmt.Fprintf(w, "catching up\t%d\n", st.CatchingUp)
		fmt.Fprintf(w, "fanned out, last minute\t%d\n", st.FannedOutLastMinute)
		fmt.Fprintf(w, "owed deliveries\t%d\n", st.Owed)
		fmt.Fprintf(w, "poisoned deliveries\t%d\n", st.PoisonedDeliveries)
		fmt.Fprintf(w, "paused\t%s\n", cell(dash(strings.Join(st.Paused, ",")), subjectWidth))
		orphaned := "-"
		if len(st.Orphaned) > 0 {
			orphaned = cell(strings.Join(st.Orphaned, ","), subjectWidth) + "  (unserved for " + c.outbox.OrphanAfter.String() +
				": deploy a release that has them, or retire them; see events subscribers)"
		}
		fmt.Fprintf(w, "orphaned\t%s\n", orphaned)
		blocked := "0"
		if st.BlockedChains > 0 {
			blocked = fmt.Sprintf("%d  (ordered subjects waiting for an operator: see events chains --blocked)", st.BlockedChains)
		}
		fmt.Fprintf(w, "blocked subjects\t%s\n", blocked)
		if watching {
			fmt.Fprintln(w)
		}
	})
}

// eventJSON is an event as --json prints it.
type eventJSON struct {
	ID            uuid.UUID        `json:"id"`
	Seq           int64            `json:"seq"`
	Type          string           `json:"type"`
	Subject       string           `json:"subject"`
	Payload       json.RawMessage  `json:"payload"`
	CreatedAt     time.Time        `json:"created_at"`
	FannedOutAt   *time.Time       `json:"fanned_out_at"`
	Fanout        map[string]int64 `json:"fanout"`
	Attempts      int              `json:"attempts"`
	LastError     string           `json:"last_error,omitempty"`
	NextAttemptAt *time.Time       `json:"next_attempt_at"`
	PoisonedAt    *time.Time       `json:"poisoned_at"`
	// Deliveries are the owed and poisoned deliveries; inspect only.
	Deliveries []deliveryJSON `json:"deliveries,omitempty"`
}

func toJSON(e events.EventInfo) eventJSON {
	return eventJSON{e.ID, e.Seq, e.Type, e.Subject, e.Payload, e.CreatedAt, opt(e.FannedOutAt), e.Fanout,
		e.Attempts, e.LastError, opt(e.NextAttemptAt), opt(e.PoisonedAt), nil}
}

func (c *cli) list(args []string) error {
	var p events.ListEventsParams
	pos, err := flags("list", args, func(fs *flag.FlagSet) {
		fs.StringVar(&p.Type, "type", "", "")
		fs.StringVar(&p.Subject, "subject", "", "")
		fs.IntVar(&p.Limit, "limit", 0, "")
		fs.StringVar(&p.After, "after", "", "")
	})
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("list: give one state: pending, retrying, poisoned or recent")
	}
	p.State = events.EventState(pos[0])
	page, err := c.outbox.ListEvents(c.ctx, c.pool, p)
	var invalid *events.ValidationError
	if errors.As(err, &invalid) {
		return usagef("list: %s %s", strings.ToLower(invalid.Field), invalid.Reason)
	}
	if err != nil {
		return err
	}
	out := struct {
		Events []eventJSON `json:"events"`
		Next   string      `json:"next,omitempty"`
	}{Events: []eventJSON{}, Next: page.Next}
	for _, e := range page.Events {
		out.Events = append(out.Events, toJSON(e))
	}
	return c.output(out, func(w *tabwriter.Writer) {
		fmt.Fprintln(w, "ID\tSEQ\tTYPE\tSUBJECT\tCREATED\tATTEMPTS\tLAST ERROR")
		for _, e := range page.Events {
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%d\t%s\n", e.ID, e.Seq, clean(e.Type), cell(e.Subject, subjectWidth),
				e.CreatedAt.UTC().Format(time.RFC3339), e.Attempts, cell(e.LastError, errorWidth))
		}
		if page.Next != "" {
			fmt.Fprintf(w, "\nnext page: --after %s\n", page.Next)
		}
	})
}

func (c *cli) inspect(args []string) error {
	if len(args) != 1 {
		return usagef("inspect: give one event ID")
	}
	id, err := uuid.Parse(args[0])
	if err != nil {
		return usagef("inspect: %q is not an event ID", args[0])
	}
	e, err := c.outbox.GetEvent(c.ctx, c.pool, id)
	if err != nil {
		return err
	}
	v := toJSON(e)
	v.Deliveries = deliveriesJSON(e.Deliveries)
	return c.output(v, func(w *tabwriter.Writer) {
		state := "pending"
		switch {
		case e.Poisoned():
			state = "poisoned"
		case !e.FannedOutAt.IsZero():
			state = "fanned out"
		case e.Attempts > 0:
			state = "retrying"
		}
		fmt.Fprintf(w, "id\t%s\nseq\t%d\ntype\t%s\nsubject\t%s\nstate\t%s\ncreated\t%s\n", e.ID, e.Seq, clean(e.Type), clean(e.Subject),
			state, e.CreatedAt.UTC().Format(time.RFC3339Nano))
		if !e.FannedOutAt.IsZero() {
			fmt.Fprintf(w, "fanned out\t%s\n", e.FannedOutAt.UTC().Format(time.RFC3339Nano))
		}
		fmt.Fprintf(w, "attempts\t%d\n", e.Attempts)
		if e.LastError != "" {
			fmt.Fprintf(w, "last error\t%s\n", clean(e.LastError))
		}
		for _, name := range sortedKeys(e.Fanout) {
			fmt.Fprintf(w, "job\t%s → %d\n", clean(name), e.Fanout[name])
		}
		printDeliveries(w, e.Deliveries)
		var pretty bytes.Buffer
		if err := json.Indent(&pretty, e.Payload, "", "  "); err != nil {
			pretty.Reset()
			pretty.Write(e.Payload)
		}
		fmt.Fprintf(w, "payload\t%s\n", strings.ReplaceAll(cleanJSON(pretty.String()), "\n", "\n\t"))
	})
}

func (c *cli) requeue(args []string) error { return c.settle("requeue", "requeued", args) }

func (c *cli) discard(args []string) error { return c.settle("discard", "discarded", args) }

// eventFlags collects the values of a repeated --event flag.
type eventFlags []string

func (e *eventFlags) String() string { return strings.Join(*e, ",") }

func (e *eventFlags) Set(v string) error { *e = append(*e, v); return nil }

// settle serves requeue and discard (cmd): the events named with --event, or
// with --all-poisoned everything poisoned, each narrowed by --type and
// --subscriber, as events.PoisonedFilter selects.
func (c *cli) settle(cmd, done string, args []string) error {
	var all, yes bool
	var typ, subscriber string
	var named eventFlags
	pos, err := flags(cmd, args, func(fs *flag.FlagSet) {
		fs.Var(&named, "event", "")
		fs.BoolVar(&all, "all-poisoned", false, "")
		fs.BoolVar(&yes, "yes", false, "")
		fs.StringVar(&typ, "type", "", "")
		fs.StringVar(&subscriber, "subscriber", "", "")
	})
	switch {
	case err != nil:
		return err
	case len(pos) > 0:
		return usagef("%s: name events with --event ID", cmd)
	case all && len(named) > 0:
		return usagef("%s: give --event or --all-poisoned, not both", cmd)
	case !all && len(named) == 0:
		return usagef("%s: give --event ID (one or more) or --all-poisoned", cmd)
	case yes && !all:
		return usagef("%s: --yes goes with --all-poisoned", cmd)
	}
	act := c.outbox.Requeue
	if cmd == "discard" {
		act = c.outbox.Discard
	}
	filter := events.PoisonedFilter{Type: typ, Subscriber: subscriber}
	if all {
		return c.settleAll(cmd, done, act, filter, yes)
	}
	ids, err := c.ids(cmd, named)
	if err != nil {
		return err
	}
	if typ != "" {
		// Refused before the first event, not once per event.
		if _, err := glob.Compile(typ); err != nil {
			return usagef("%s: --type %v", cmd, err)
		}
	}
	one := func(id uuid.UUID, _ string) error {
		f := filter
		f.EventIDs = []uuid.UUID{id}
		_, err := act(c.ctx, c.pool, f)
		return err
	}
	if subscriber != "" {
		return c.eachDelivery(done, subscriber, ids, one)
	}
	return c.each(done, ids, func(id uuid.UUID) error { return one(id, "") })
}

// settleAll requeues or discards (act) everything poisoned that filter
// selects, after counting it and asking (unless yes).
func (c *cli) settleAll(cmd, done string, act func(context.Context, events.DB, events.PoisonedFilter) (int64, error),
	filter events.PoisonedFilter, yes bool,
) error {
	deliveries, whole, err := c.countPoisoned(filter)
	var invalid *events.ValidationError
	if errors.As(err, &invalid) {
		return usagef("%s: --%s %s", cmd, strings.ToLower(invalid.Field), invalid.Reason)
	}
	if err != nil {
		return err
	}
	scope := ofType(filter.Type)
	if filter.Subscriber != "" {
		scope = " for " + clean(filter.Subscriber) + scope
	}
	var n int64
	if deliveries+whole > 0 {
		question := fmt.Sprintf("%s %d poisoned deliveries%s", cmd, deliveries, scope)
		if whole > 0 {
			question += fmt.Sprintf(" and %d event(s) poisoned as a whole", whole)
		}
		if !yes && !c.confirm(question+"?") {
			return fmt.Errorf("%s: not confirmed (answer y, or pass --yes)", cmd)
		}
		if n, err = act(c.ctx, c.pool, filter); err != nil {
			return err
		}
	}
	return c.output(map[string]any{done + "_count": n, "type": filter.Type, "subscriber": filter.Subscriber},
		func(w *tabwriter.Writer) { fmt.Fprintf(w, "%s\t%d\t%s\n", done, n, strings.TrimPrefix(scope, " ")) })
}

// countPoisoned counts what filter (no EventIDs) selects: poisoned
// deliveries, and events poisoned as a whole (none with a subscriber).
func (c *cli) countPoisoned(filter events.PoisonedFilter) (deliveries, whole int64, err error) {
	dp := events.ListDeliveriesParams{State: events.DeliveryPoisoned, Type: filter.Type, Subscriber: filter.Subscriber, Limit: 1000}
	for {
		page, err := c.outbox.ListDeliveries(c.ctx, c.pool, dp)
		if err != nil {
			return 0, 0, err
		}
		deliveries += int64(len(page.Deliveries))
		if page.Next == "" {
			break
		}
		dp.After = page.Next
	}
	if filter.Subscriber != "" {
		return deliveries, 0, nil
	}
	ep := events.ListEventsParams{State: events.EventPoisoned, Type: filter.Type, Limit: 1000}
	for {
		page, err := c.outbox.ListEvents(c.ctx, c.pool, ep)
		if err != nil {
			return 0, 0, err
		}
		for _, e := range page.Events {
			if e.FannedOutAt.IsZero() { // poisoned as a whole: never fanned out
				whole++
			}
		}
		if page.Next == "" {
			return deliveries, whole, nil
		}
		ep.After = page.Next
	}
}

// ids parses event IDs.
func (c *cli) ids(cmd string, args []string) ([]uuid.UUID, error) {
	if len(args) == 0 {
		return nil, usagef("%s: give at least one event ID", cmd)
	}
	ids := make([]uuid.UUID, len(args))
	for i, a := range args {
		id, err := uuid.Parse(a)
		if err != nil {
			return nil, usagef("%s: %q is not an event ID", cmd, a)
		}
		ids[i] = id
	}
	return ids, nil
}

// each applies f to every ID, reports what worked, and fails if any failed.
func (c *cli) each(done string, ids []uuid.UUID, f func(uuid.UUID) error) error {
	var ok []uuid.UUID
	var failed int
	for _, id := range ids {
		if err := f(id); err != nil {
			fmt.Fprintln(c.stderr, errorLine(err))
			failed++
			continue
		}
		ok = append(ok, id)
	}
	if err := c.report(done, ok); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d event(s) not %s", failed, len(ids), done)
	}
	return nil
}

func (c *cli) report(done string, ids []uuid.UUID) error {
	if ids == nil {
		ids = []uuid.UUID{}
	}
	return c.output(map[string][]uuid.UUID{done: ids}, func(w *tabwriter.Writer) {
		for _, id := range ids {
			fmt.Fprintf(w, "%s\t%s\n", done, id)
		}
		if len(ids) == 0 {
			fmt.Fprintf(w, "nothing %s\n", done)
		}
	})
}

// confirm asks a yes/no question on stdin; anything but y or yes is no.
func (c *cli) confirm(question string) bool {
	fmt.Fprintf(c.stderr, "%s [y/N] ", clean(question))
	line, _ := bufio.NewReader(c.stdin).ReadString('\n')
	answer := strings.ToLower(strings.TrimSpace(line))
	return answer == "y" || answer == "yes"
}

func (c *cli) watch(args []string) error {
	if len(args) != 1 || args[0] != "list" {
		return usagef("watch: the only subcommand is list")
	}
	ws, err := c.outbox.ListWatches(c.ctx, c.pool)
	if err != nil {
		return err
	}
	type row struct {
		Table   string            `json:"table"`
		Name    string            `json:"name"`
		Types   map[string]string `json:"types"`
		Subject string            `json:"subject"`
		Payload string            `json:"payload"`
	}
	rows := []row{}
	for _, w := range ws {
		r := row{Table: w.TableSchema + "." + w.Table, Name: w.Name, Types: map[string]string{}, Payload: string(w.Payload)}
		for op, typ := range w.Types {
			r.Types[strings.ToLower(string(op))] = typ
		}
		r.Subject = w.SubjectPrefix
		if w.SubjectColumn != "-" {
			r.Subject += "<" + w.SubjectColumn + ">"
		}
		if len(w.PayloadColumns) > 0 {
			r.Payload += " (" + strings.Join(w.PayloadColumns, ", ") + ")"
		}
		rows = append(rows, r)
	}
	return c.output(rows, func(w *tabwriter.Writer) {
		fmt.Fprintln(w, "TABLE\tNAME\tOPERATION\tEVENT TYPE\tSUBJECT\tPAYLOAD")
		for _, r := range rows {
			for _, op := range []string{"insert", "update", "delete"} {
				if typ, ok := r.Types[op]; ok {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", clean(r.Table), clean(r.Name), op, clean(typ), clean(r.Subject), clean(r.Payload))
				}
			}
		}
	})
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func ofType(typ string) string {
	if typ == "" {
		return ""
	}
	return " of type " + typ
}

func sortedKeys(m map[string]int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
