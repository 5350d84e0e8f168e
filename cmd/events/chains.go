package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/standmeet/events"
)

// The chains of ordered subscribers: which subjects wait behind a head, and
// which are blocked (the head's job discarded, cancelled or deleted), with
// resume (retry the head) and skip (give it up, the next runs).

// chainJSON is a chain as --json prints it.
type chainJSON struct {
	Subscriber    string     `json:"subscriber"`
	Subject       string     `json:"subject"`
	HeadJobID     int64      `json:"head_job_id"`
	HeadEventID   *uuid.UUID `json:"head_event_id"`
	HeadEventSeq  int64      `json:"head_event_seq,omitempty"`
	HeadEventType string     `json:"head_event_type,omitempty"`
	HeadState     string     `json:"head_state"`
	Attempt       int        `json:"attempt"`
	MaxAttempts   int        `json:"max_attempts"`
	LastError     string     `json:"last_error,omitempty"`
	Jobs          int64      `json:"jobs"`
	BlockedAt     *time.Time `json:"blocked_at"`
	BlockedState  string     `json:"blocked_state,omitempty"`
}

func toChainJSON(c events.ChainInfo) chainJSON {
	v := chainJSON{Subscriber: c.Subscriber, Subject: c.Subject, HeadJobID: c.HeadJobID, HeadEventSeq: c.HeadEventSeq,
		HeadEventType: c.HeadEventType, HeadState: c.HeadState, Attempt: c.Attempt, MaxAttempts: c.MaxAttempts,
		LastError: c.LastError, Jobs: c.Jobs, BlockedAt: opt(c.BlockedAt), BlockedState: c.BlockedState}
	if c.HeadEventID != uuid.Nil {
		v.HeadEventID = &c.HeadEventID
	}
	return v
}

// chains runs "chains", "chains resume S SUBJECT" and "chains skip S
// SUBJECT".
func (c *cli) chains(args []string) error {
	if len(args) > 0 && (args[0] == "resume" || args[0] == "skip") {
		return c.chainAction(args[0], args[1:])
	}
	var p events.ListChainsParams
	pos, err := flags("chains", args, func(fs *flag.FlagSet) {
		fs.BoolVar(&p.Blocked, "blocked", false, "")
		fs.StringVar(&p.Subscriber, "subscriber", "", "")
		fs.IntVar(&p.Limit, "limit", 0, "")
		fs.StringVar(&p.After, "after", "", "")
	})
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("chains: unexpected %q (resume and skip come first: chains skip SUBSCRIBER SUBJECT)", pos[0])
	}
	page, err := c.outbox.ListChains(c.ctx, c.pool, p)
	var invalid *events.ValidationError
	if errors.As(err, &invalid) {
		return usagef("chains: %s %s", strings.ToLower(invalid.Field), invalid.Reason)
	}
	if err != nil {
		return err
	}
	out := struct {
		Chains []chainJSON `json:"chains"`
		Next   string      `json:"next,omitempty"`
	}{Chains: []chainJSON{}, Next: page.Next}
	for _, ch := range page.Chains {
		out.Chains = append(out.Chains, toChainJSON(ch))
	}
	return c.output(out, func(w *tabwriter.Writer) {
		fmt.Fprintln(w, "SUBSCRIBER\tSUBJECT\tSTATE\tJOBS\tHEAD JOB\tHEAD EVENT\tSEQ\tTYPE\tATTEMPT\tLAST ERROR")
		for _, ch := range page.Chains {
			state := dash(ch.HeadState)
			if ch.Blocked() {
				state = "BLOCKED (" + ch.BlockedState + ")"
			}
			event := "-"
			if ch.HeadEventID != uuid.Nil {
				event = ch.HeadEventID.String()
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\t%d\t%s\t%d/%d\t%s\n", clean(ch.Subscriber), cell(ch.Subject, subjectWidth), state,
				ch.Jobs, ch.HeadJobID, event, ch.HeadEventSeq, clean(dash(ch.HeadEventType)), ch.Attempt, ch.MaxAttempts,
				cell(dash(ch.LastError), errorWidth))
		}
		if len(page.Chains) == 0 {
			if p.Blocked {
				fmt.Fprintln(w, "no blocked subject")
			} else {
				fmt.Fprintln(w, "no subject waiting")
			}
		}
		if page.Next != "" {
			// Quoted for a shell; a subject's control bytes are shown
			// escaped (--json gives the cursor exactly).
			fmt.Fprintf(w, "\nnext page: --after '%s'\n", clean(strings.ReplaceAll(page.Next, "'", `'\''`)))
		}
	})
}

// chainAction resumes or skips one blocked chain.
func (c *cli) chainAction(cmd string, args []string) error {
	if len(args) != 2 {
		return usagef("chains %s: give a subscriber and a subject", cmd)
	}
	sub, subject := args[0], args[1]
	f, done := c.outbox.ResumeChain, "resumed"
	if cmd == "skip" {
		f, done = c.outbox.SkipChain, "skipped"
	}
	err := f(c.ctx, c.pool, sub, subject)
	var invalid *events.ValidationError
	if errors.As(err, &invalid) {
		return usagef("chains %s: %s %s", cmd, strings.ToLower(invalid.Field), invalid.Reason)
	}
	if err != nil {
		return err
	}
	return c.output(map[string]string{"subscriber": sub, "subject": subject, "done": done}, func(w *tabwriter.Writer) {
		what := "the head's job is retried; the jobs behind it follow once it succeeds"
		if cmd == "skip" {
			what = "the head is given up; the next job of the subject runs"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t(%s)\n", done, clean(sub), clean(subject), what)
	})
}
