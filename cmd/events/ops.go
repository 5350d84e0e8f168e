package main

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/standmeet/events"
)

// The per-subscriber commands: who serves what (relays, subscribers), the
// deliveries (event, subscriber) still owed or poisoned, and the operator's
// hands on one subscriber (pause, resume) or one delivery (requeue and
// discard with --subscriber).

// silentAfter is how long a relay that has not stopped may go without
// reporting in before the CLI calls it dead: relays report every 5 s.
const silentAfter = 30 * time.Second

// relayName is how a relay is named in a table: its host and PID.
func relayName(r events.RelayInfo) string { return fmt.Sprintf("%s:%d", r.Host, r.PID) }

// relayState is running, stopped, or dead (silent for silentAfter without
// having stopped: killed, or cut off from the database).
func relayState(r events.RelayInfo, now time.Time) string {
	switch {
	case !r.StoppedAt.IsZero():
		return "stopped"
	case now.Sub(r.LastSeenAt) > silentAfter:
		return "dead"
	}
	return "running"
}

// age is how long ago t was, rounded for a table (to seconds under a
// minute, to minutes above); "-" for the zero time.
func age(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	if d < time.Minute {
		return d.Round(time.Second).String()
	}
	return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func opt(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// relayJSON is a relay as --json prints it.
type relayJSON struct {
	ID                  uuid.UUID  `json:"id"`
	Host                string     `json:"host"`
	PID                 int        `json:"pid"`
	Version             string     `json:"version"`
	Subscribers         []string   `json:"subscribers"`
	StartedAt           time.Time  `json:"started_at"`
	LastSeenAt          time.Time  `json:"last_seen_at"`
	StoppedAt           *time.Time `json:"stopped_at"`
	State               string     `json:"state"`
	Listening           bool       `json:"listening"`
	PollOnly            bool       `json:"poll_only"`
	ConsecutiveFailures int        `json:"consecutive_failures"`
	LastRoundAt         *time.Time `json:"last_round_at"`
}

func (c *cli) relays(args []string) error {
	if len(args) > 0 {
		return usagef("relays takes no arguments")
	}
	list, err := c.outbox.ListRelays(c.ctx, c.pool)
	if err != nil {
		return err
	}
	now := time.Now()
	rows := []relayJSON{}
	for _, r := range list {
		rows = append(rows, relayJSON{r.ID, r.Host, r.PID, r.Version, nonNil(r.Subscribers), r.StartedAt, r.LastSeenAt, opt(r.StoppedAt),
			relayState(r, now), r.Listening, r.PollOnly, r.ConsecutiveFailures, opt(r.LastRoundAt)})
	}
	return c.output(rows, func(w *tabwriter.Writer) {
		fmt.Fprintln(w, "RELAY\tSTATE\tVERSION\tSUBSCRIBERS\tSTARTED\tLAST SEEN\tMODE\tFAILURES\tLAST ROUND")
		for _, r := range rows {
			mode := "not listening"
			switch {
			case r.PollOnly:
				mode = "polling"
			case r.Listening:
				mode = "listening"
			}
			last := "-"
			if r.LastRoundAt != nil {
				last = stamp(*r.LastRoundAt)
			}
			fmt.Fprintf(w, "%s:%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", clean(r.Host), r.PID, r.State, cell(dash(r.Version), 20),
				cell(strings.Join(r.Subscribers, ","), subjectWidth), stamp(r.StartedAt), stamp(r.LastSeenAt), mode,
				r.ConsecutiveFailures, last)
		}
	})
}

// subscriberJSON is a subscriber as --json prints it.
type subscriberJSON struct {
	Name            string     `json:"name"`
	Types           []string   `json:"types"`
	RegisteredAt    time.Time  `json:"registered_at"`
	RetiredAt       *time.Time `json:"retired_at"`
	PausedAt        *time.Time `json:"paused_at"`
	Orphaned        bool       `json:"orphaned"`
	Owed            int64      `json:"owed"`
	OldestOwedSince *time.Time `json:"oldest_owed_since"`
	Poisoned        int64      `json:"poisoned"`
	LastServedAt    *time.Time `json:"last_served_at"`
	// LastServedBy is the relay that last reported serving it.
	LastServedBy *uuid.UUID `json:"last_served_by"`
	lastServedBy string
	Backfill     *backfillJSON `json:"backfill"`
}

type backfillJSON struct {
	Since  time.Time  `json:"since"`
	Seq    int64      `json:"seq"`
	DoneAt *time.Time `json:"done_at"`
}

func (c *cli) subscribers(args []string) error {
	pos, err := flags("subscribers", args, func(fs *flag.FlagSet) {
		fs.DurationVar(&c.outbox.OrphanAfter, "orphan-after", events.OrphanAfterDefault, "")
	})
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("subscribers takes no arguments")
	}
	subs, err := c.outbox.ListSubscribers(c.ctx, c.pool)
	if err != nil {
		return err
	}
	counts, err := c.outbox.CountDeliveries(c.ctx, c.pool)
	if err != nil {
		return err
	}
	relays, err := c.outbox.ListRelays(c.ctx, c.pool)
	if err != nil {
		return err
	}
	st, err := c.outbox.GetStats(c.ctx, c.pool)
	if err != nil {
		return err
	}
	rows := []subscriberJSON{}
	for _, s := range subs {
		n := counts[s.Name]
		r := subscriberJSON{Name: s.Name, Types: nonNil(s.Types), RegisteredAt: s.RegisteredAt, RetiredAt: opt(s.RetiredAt),
			PausedAt: opt(s.PausedAt), Orphaned: slices.Contains(st.Orphaned, s.Name), Owed: n.Owed,
			OldestOwedSince: opt(n.OldestOwedSince), Poisoned: n.Poisoned, LastServedAt: opt(s.LastServedAt)}
		// The relay that last reported in with it (ListRelays is oldest
		// first, so the last match is the latest).
		var by *events.RelayInfo
		for i := range relays {
			if slices.Contains(relays[i].Subscribers, s.Name) && (by == nil || !relays[i].LastSeenAt.Before(by.LastSeenAt)) {
				by = &relays[i]
			}
		}
		if by != nil {
			r.LastServedBy, r.lastServedBy = &by.ID, relayName(*by)
		}
		if !s.BackfillSince.IsZero() {
			r.Backfill = &backfillJSON{s.BackfillSince, s.BackfillSeq, opt(s.BackfillDoneAt)}
		}
		rows = append(rows, r)
	}
	now := time.Now()
	return c.output(rows, func(w *tabwriter.Writer) {
		fmt.Fprintln(w, "NAME\tSTATE\tTYPES\tOWED\tOLDEST OWED\tPOISONED\tLAST SERVED\tBY\tREGISTERED\tBACKFILL")
		var orphans []string
		for _, r := range rows {
			state := "active"
			switch {
			case r.RetiredAt != nil:
				state = "retired " + stamp(*r.RetiredAt)
			case r.Orphaned:
				state = "ORPHANED"
				orphans = append(orphans, r.Name)
			case r.PausedAt != nil:
				state = "paused"
			}
			if r.Orphaned && r.PausedAt != nil {
				state += ",paused"
			}
			oldest, served := "-", "-"
			if r.OldestOwedSince != nil {
				oldest = age(*r.OldestOwedSince, now)
			}
			if r.LastServedAt != nil {
				served = stamp(*r.LastServedAt)
			}
			backfill := "-"
			if b := r.Backfill; b != nil {
				backfill = fmt.Sprintf("since %s: seq %d", stamp(b.Since), b.Seq)
				if b.DoneAt != nil {
					backfill += ", done"
				}
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\n", clean(r.Name), state, cell(dash(strings.Join(r.Types, ",")), subjectWidth),
				r.Owed, oldest, r.Poisoned, served, cell(dash(r.lastServedBy), subjectWidth), stamp(r.RegisteredAt), backfill)
		}
		for _, name := range orphans {
			fmt.Fprintf(w, "\nwarning: no running relay has served %s for %s: its events pile up as owed; deploy a release that has it, or retire it (Outbox.RetireSubscriber)\n",
				clean(name), c.outbox.OrphanAfter)
		}
	})
}

// deliveryJSON is a delivery as --json prints it.
type deliveryJSON struct {
	EventID       uuid.UUID             `json:"event_id"`
	Seq           int64                 `json:"seq"`
	Type          string                `json:"type"`
	Subject       string                `json:"subject"`
	Subscriber    string                `json:"subscriber"`
	Attempts      int                   `json:"attempts"`
	LastError     string                `json:"last_error,omitempty"`
	Errors        []events.AttemptError `json:"errors"`
	OwedSince     time.Time             `json:"owed_since"`
	NextAttemptAt *time.Time            `json:"next_attempt_at"`
	PoisonedAt    *time.Time            `json:"poisoned_at"`
}

func toDeliveryJSON(d events.DeliveryInfo) deliveryJSON {
	errs := d.Errors
	if errs == nil {
		errs = []events.AttemptError{}
	}
	next := opt(d.NextAttemptAt)
	if d.Poisoned() {
		next = nil
	}
	return deliveryJSON{d.EventID, d.Seq, d.Type, d.Subject, d.Subscriber, d.Attempts, d.LastError, errs, d.OwedSince, next, opt(d.PoisonedAt)}
}

func (c *cli) deliveries(args []string) error {
	var p events.ListDeliveriesParams
	pos, err := flags("deliveries", args, func(fs *flag.FlagSet) {
		fs.StringVar(&p.Type, "type", "", "")
		fs.StringVar(&p.Subscriber, "subscriber", "", "")
		fs.IntVar(&p.Limit, "limit", 0, "")
		fs.StringVar(&p.After, "after", "", "")
	})
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 1:
		return usagef("deliveries: give at most one state: poisoned or owed")
	case len(pos) == 1:
		p.State = events.DeliveryState(pos[0])
	default:
		p.State = events.DeliveryPoisoned
	}
	page, err := c.outbox.ListDeliveries(c.ctx, c.pool, p)
	var invalid *events.ValidationError
	if errors.As(err, &invalid) {
		return usagef("deliveries: %s %s", strings.ToLower(invalid.Field), invalid.Reason)
	}
	if err != nil {
		return err
	}
	out := struct {
		Deliveries []deliveryJSON `json:"deliveries"`
		Next       string         `json:"next,omitempty"`
	}{Deliveries: []deliveryJSON{}, Next: page.Next}
	for _, d := range page.Deliveries {
		out.Deliveries = append(out.Deliveries, toDeliveryJSON(d))
	}
	return c.output(out, func(w *tabwriter.Writer) {
		when := "NEXT ATTEMPT"
		if p.State == events.DeliveryPoisoned {
			when = "POISONED"
		}
		fmt.Fprintf(w, "EVENT\tSEQ\tTYPE\tSUBJECT\tSUBSCRIBER\tOWED SINCE\t%s\tATTEMPTS\tLAST ERROR\n", when)
		for _, d := range page.Deliveries {
			at := d.NextAttemptAt
			if d.Poisoned() {
				at = d.PoisonedAt
			}
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", d.EventID, d.Seq, clean(d.Type), cell(d.Subject, subjectWidth),
				clean(d.Subscriber), stamp(d.OwedSince), stamp(at), d.Attempts, cell(dash(d.LastError), errorWidth))
		}
		if page.Next != "" {
			fmt.Fprintf(w, "\nnext page: --after %s\n", page.Next)
		}
	})
}

func (c *cli) pause(args []string) error  { return c.pauseResume("pause", "paused", args) }
func (c *cli) resume(args []string) error { return c.pauseResume("resume", "resumed", args) }

func (c *cli) pauseResume(cmd, done string, args []string) error {
	if len(args) != 1 {
		return usagef("%s: give one subscriber name", cmd)
	}
	f := c.outbox.PauseSubscriber
	if cmd == "resume" {
		f = c.outbox.ResumeSubscriber
	}
	if err := f(c.ctx, c.pool, args[0]); err != nil {
		return err
	}
	return c.output(map[string]string{done: args[0]}, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "%s\t%s\n", done, clean(args[0]))
	})
}

// eachDelivery is each for the deliveries of ids to subscriber.
func (c *cli) eachDelivery(done, subscriber string, ids []uuid.UUID, f func(uuid.UUID, string) error) error {
	var ok []uuid.UUID
	var failed int
	for _, id := range ids {
		if err := f(id, subscriber); err != nil {
			fmt.Fprintln(c.stderr, errorLine(err))
			failed++
			continue
		}
		ok = append(ok, id)
	}
	if ok == nil {
		ok = []uuid.UUID{}
	}
	err := c.output(map[string]any{done: ok, "subscriber": subscriber}, func(w *tabwriter.Writer) {
		for _, id := range ok {
			fmt.Fprintf(w, "%s\t%s\tfor %s\n", done, id, clean(subscriber))
		}
		if len(ok) == 0 {
			fmt.Fprintf(w, "nothing %s\n", done)
		}
	})
	if err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d deliveries not %s", failed, len(ids), done)
	}
	return nil
}

// deliveriesJSON is an event's owed and poisoned deliveries as --json prints
// them (in inspect).
func deliveriesJSON(ds []events.DeliveryInfo) []deliveryJSON {
	out := []deliveryJSON{}
	for _, d := range ds {
		out = append(out, toDeliveryJSON(d))
	}
	return out
}

// printDeliveries writes inspect's lines for an event's deliveries: each owed or
// poisoned subscriber, then its error history.
func printDeliveries(w *tabwriter.Writer, ds []events.DeliveryInfo) {
	for _, d := range ds {
		state := "owed, next attempt " + stamp(d.NextAttemptAt)
		if d.Poisoned() {
			state = "poisoned " + stamp(d.PoisonedAt)
		}
		fmt.Fprintf(w, "delivery\t%s: %s, %d attempt(s), owed since %s\n", clean(d.Subscriber), state, d.Attempts, stamp(d.OwedSince))
		for _, e := range d.Errors {
			fmt.Fprintf(w, "  error\t%s %s: %s\n", clean(d.Subscriber), stamp(e.At), clean(e.Error))
		}
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
