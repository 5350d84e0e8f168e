package events

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/standmeet/events/internal/engine"
	"github.com/standmeet/events/internal/glob"
)

// Subscriber is something that wants River jobs for events of some types.
// Register it with [Relay.Subscribe]. Exactly one of Map, Handle and
// HandleTx is set.
type Subscriber struct {
	// Name identifies the subscriber. It is the key under which an event's
	// fanout records the subscriber's job, so keep it stable across releases.
	// 1 to 64 characters: lowercase ASCII letters, digits, '_' and '-', not
	// ending in '-' (River refuses a job tag that ends in '-', and every job
	// is tagged "events-subscriber-<Name>").
	//
	// The database keeps a registry of names: see [Relay.Start] and
	// [Outbox.RetireSubscriber].
	Name string

	// Types selects events by type, with glob patterns on dot-separated
	// segments: a literal segment matches itself, "*" matches exactly one
	// segment and "**" matches zero or more. For example "corpus.note.*"
	// matches corpus.note.changed, and "supplier.**" matches supplier,
	// supplier.connected and supplier.a.b. At least one pattern.
	Types []string

	// Coalesce asks for one job per subject per relay batch, for the latest
	// event of that subject (the highest Seq); the fanout of every earlier
	// event of that subject in the batch names the same job. Fit for
	// subscribers that re-read current state (a search index); not for ones
	// where every event is a fact to deliver (webhooks, e-mail). Events with
	// an empty Subject are never coalesced.
	Coalesce bool

	// Map turns an event into the host's own River job. The host registers
	// the worker for the returned args as usual. Returning nil args skips the
	// event for this subscriber (no job, no fanout entry). Returned opts may be
	// nil; they are copied, never modified.
	//
	// Map is called inside the relay's transaction for every matching event,
	// including ones a coalescing subscriber then folds, so keep it a cheap,
	// pure function of the event. An error or a panic counts as a failed
	// attempt for this subscriber and that event alone (see
	// [RelayConfig.MaxAttempts]): the event's other subscribers get their jobs,
	// and this one's is retried with the backoff.
	Map func(ctx context.Context, e Event) (river.JobArgs, *river.InsertOpts, error)

	// Handle is called with the full event from a River job of kind
	// [HandleArgs.Kind], worked by the worker that [Relay.AddWorkers]
	// registers. An error is retried by River's retry policy, like any job.
	Handle func(ctx context.Context, e Event) error

	// HandleTx is Handle for a handler whose effects are writes to the same
	// database: it runs inside a transaction, begun on the relay's pool at
	// the database's default isolation (an Ordered subscriber's at READ
	// COMMITTED: its completion locks the chain's row, which others update
	// meanwhile and a stronger level would refuse with a serialization
	// failure), in which the library also
	// completes the River job
	// (river.JobCompleteTx), so the handler's writes and the job's
	// completion commit together or not at all. An error or a panic rolls
	// both back and River retries the job; a crash before the commit leaves
	// the job to River's rescuer, which runs it again, and its effects were
	// never committed. So each effect exists if and only if its job
	// completed, once. Keep the transaction short; the job's handler jobs
	// are worked by the worker [Relay.AddWorkers] registers, like Handle's.
	HandleTx func(ctx context.Context, tx pgx.Tx, e Event) error

	// Ordered asks for one subject's events to be handled one at a time, in
	// order, while different subjects run in parallel: for this subscriber
	// and one subject, a job (of Map, Handle or HandleTx alike) starts only
	// once the one before it has completed. Every job is still a River job
	// of its own, retried by River; the jobs of a subject form a chain, only
	// its head is released, and the ones behind it wait in River's pending
	// state until the head's completion releases the next, in the same
	// transaction. Events with an empty Subject are not ordered.
	//
	// The order is the order in which the relays append the subject's events
	// to the chain. A relay appends in the transaction that fans the events
	// out, and never while an earlier event of the subject (a lower Seq) is
	// still owed to the subscriber elsewhere — being fanned out by another
	// relay, retrying, or owed during a rolling deploy, a pause or a
	// backfill: it waits for it, or leaves its own to follow it. So the
	// order is Seq order among the events visible when they are appended,
	// and it is commit order whenever the producers of a subject serialise
	// their writes (they lock the same row), which is the usual case.
	// Events a producer commits late, after a later event of the subject
	// was appended, come after it.
	//
	// A job that fails is retried by River while the ones behind it wait.
	// When River discards it (its attempts spent) or it is cancelled or
	// deleted, OrderedOnDiscard decides: by default the subject blocks until
	// an operator resumes or skips it ([Outbox.ResumeChain],
	// [Outbox.SkipChain]); a stuck subject never holds back another.
	//
	// With Coalesce, the events of a subject in one relay batch share one
	// job, as for any coalescing subscriber, and a job whose subject's last
	// job is still waiting replaces that job's event with its own (the
	// waiting job runs once, with the latest event); a job already released
	// is never replaced.
	//
	// Map subscribers' jobs are worked by the host's workers: list
	// [OrderedMiddleware] in the River config of every client that works
	// them, so their completion releases the next job. See the README's
	// "Ordered subscribers".
	Ordered bool

	// OrderedOnDiscard is what an Ordered subscriber's subject does when the
	// job at its head is discarded, cancelled or deleted: OrderedBlock (the
	// default: it waits for an operator) or OrderedContinue (it goes on with
	// the next job). Only with Ordered.
	OrderedOnDiscard OrderedDiscard

	// InsertOpts are the River insert options of a Handle or HandleTx
	// subscriber's jobs
	// (queue, priority, max attempts, …). Ignored for Map subscribers. Nil
	// means River's defaults.
	InsertOpts *river.InsertOpts
}

// subscriberNameRE accepts exactly the names whose tag
// "events-subscriber-<name>" River accepts (`\A[\w][\w\-]+[\w]\z`): the
// last character must be a word character.
var subscriberNameRE = regexp.MustCompile(`^[a-z0-9_-]{0,63}[a-z0-9_]$`)

// subscription is a validated Subscriber, and what the engine serves of it
// (package engine).
type subscription struct {
	Subscriber
	eng *engine.Subscription
}

func newSubscription(s Subscriber) (*subscription, error) {
	bad := func(field, msg string, args ...any) error {
		return invalidf(ErrInvalidSubscriber, field, "%s (subscriber %q)", fmt.Sprintf(msg, args...), s.Name)
	}
	if !subscriberNameRE.MatchString(s.Name) {
		return nil, bad("Name", "must be 1 to 64 characters of a-z, 0-9, '_' and '-', not ending in '-'")
	}
	if len(s.Types) == 0 {
		return nil, bad("Types", "is empty; give at least one pattern, such as \"**\" for every event")
	}
	set := 0
	for _, f := range []bool{s.Map != nil, s.Handle != nil, s.HandleTx != nil} {
		if f {
			set++
		}
	}
	if set != 1 {
		return nil, bad("Map/Handle", "exactly one of Map, Handle and HandleTx must be set")
	}
	if err := validateOrdered(s, bad); err != nil {
		return nil, err
	}
	var (
		patterns []glob.Pattern
		res      []string
	)
	for _, t := range s.Types {
		p, err := glob.Compile(t)
		if err != nil {
			return nil, bad("Types", "%v", err)
		}
		patterns, res = append(patterns, p), append(res, p.Regexp())
	}
	sub := &subscription{Subscriber: s}
	sub.eng = engine.NewSubscription(engine.Subscription{
		Name: s.Name, Patterns: patterns, TypesRE: strings.Join(res, "|"), Coalesce: s.Coalesce,
		Ordered: s.Ordered, Continue: s.OrderedOnDiscard == OrderedContinue,
		Job: func(ctx context.Context, e engine.Event) (engine.Mapped, error) { return sub.jobFor(ctx, Event(e)) },
	})
	return sub, nil
}

// registryTypes returns the subscriber's globs as the registry stores them
// (comma-separated: a glob has no comma) and one regular expression for all
// of them, matched in SQL against '.' || type.
func (s *subscription) registryTypes() (types, re string) {
	return strings.Join(s.Types, ","), s.eng.TypesRE
}

// jobFor maps e to the subscriber's job. It also reads what the relay
// needs of the job's args itself, Kind and the args' own tags (InsertOpts):
// host code, like Map, so a panic in any of them is an error of the delivery.
// (River calls them again in its insert, where insertMany recovers.)
func (s *subscription) jobFor(ctx context.Context, e Event) (m engine.Mapped, err error) {
	what := "Map"
	defer func() {
		if p := recover(); p != nil {
			m, err = engine.Mapped{}, engine.PanicError(fmt.Sprintf("subscriber %q: %s", s.Name, what), p)
		}
	}()
	if s.Handle != nil || s.HandleTx != nil {
		m.Args, m.Opts = HandleArgs{Subscriber: s.Name, Event: e}, s.InsertOpts
	} else if m.Args, m.Opts, err = s.Map(ctx, e); err != nil {
		return engine.Mapped{}, fmt.Errorf("subscriber %q: Map: %w", s.Name, err)
	}
	if m.Args == nil {
		return engine.Mapped{}, nil
	}
	what = "the job args' Kind or InsertOpts"
	m.Kind = m.Args.Kind()
	if a, ok := m.Args.(river.JobArgsWithInsertOpts); ok {
		opts := a.InsertOpts()
		m.Tags, m.Unique = opts.Tags, engine.AsksUnique(&opts)
	}
	return m, nil
}
