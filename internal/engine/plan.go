package engine

import (
	"context"
	"errors"
	"slices"

	"github.com/riverqueue/river"
)

// plannedJob is one River job a round will insert.
type plannedJob struct {
	mapped     // the subscriber's job for the event it carries
	event  int // index in the batch of that event
	// covers lists the batch indexes of the events whose fanout names this
	// job: the event itself, plus, for a coalescing subscriber, the earlier
	// events of the same subject.
	covers []int
	// chain is the job's place in its chain, for an ordered subscriber's
	// job with a subject; nil otherwise.
	chain *chainJob
}

// mapped is one subscriber's job for one event, before coalescing.
type mapped struct {
	sub  *Subscription
	args river.JobArgs
	opts *river.InsertOpts
	kind string   // args.Kind()
	tags []string // the args' own InsertOpts' tags
	// unique is set when the job asks River for uniqueness (its
	// subscriber's or its args' InsertOpts): River's COPY insert cannot
	// take it.
	unique bool
}

// pairFailure is a delivery whose attempt failed: the
// subscriber's Map failed or panicked, or River or PostgreSQL refused its
// job. attempts counts the delivery's failed attempts before this one.
type pairFailure struct {
	row      claimedRow
	sub      *Subscription
	attempts int
	err      error
}

// roundPlan is what a round will do with its batch.
type roundPlan struct {
	jobs   []plannedJob
	failed []pairFailure
}

// plan matches every event of batch (ordered by seq) against the
// subscribers, maps it to jobs, and coalesces where subscribers opted in.
//
// A delivery whose mapping fails is left out of the round (it is charged and
// stays owed), so it can neither carry nor be folded into a coalesced job;
// the event's other deliveries go ahead. In the pending lane the subscribers this
// relay serves are considered (paused ones are left owed); in the
// deliveries lane only the deliveries claimed.
//
// Host code is not called once the relay is stopping: the plan fails with
// errStopping and the round rolls back, charging nothing.
func (r *Relay) plan(ctx context.Context, l Lane, batch []claimedRow) (roundPlan, error) {
	var p roundPlan
	perEvent := make([][]mapped, len(batch))
	var paused []string
	if l == LanePending {
		paused = batch[0].paused
	}
	for i, c := range batch {
		if r.stopping() || ctx.Err() != nil {
			return roundPlan{}, errStopping
		}
		try := func(sub *Subscription, attempts int) {
			m, err := sub.jobFor(ctx, c.Event)
			switch {
			case err != nil:
				p.failed = append(p.failed, pairFailure{row: c, sub: sub, attempts: attempts, err: err})
			case m.args != nil:
				perEvent[i] = append(perEvent[i], m)
			}
		}
		if l == LaneOwed {
			for _, o := range c.owed {
				// Claimed only for subscribers of this run: a delivery that no
				// longer matches (its types changed) is served with no job.
				if sub := r.activeSub(o.sub); sub != nil && sub.Matches(c.Type) {
					try(sub, o.attempts)
				}
			}
			continue
		}
		for _, sub := range r.active {
			if sub.Matches(c.Type) && !slices.Contains(paused, sub.Name) {
				try(sub, 0)
			}
		}
	}

	p.jobs = coalesce(batch, perEvent)
	return p, nil
}

// activeSub returns the run's active subscription named name, or nil.
func (r *Relay) activeSub(name string) *Subscription {
	for _, s := range r.active {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// errStopping ends a round that the relay's stop interrupted. It is nobody's
// fault: nothing is charged.
var errStopping = errors.New("events: relay stopping")

// insertOpts returns the job's insert options with the relay's tag added,
// "events-subscriber-<name>", so a subscriber's jobs can be told apart in
// River UI or SQL. A tag rather than metadata: River keeps a GIN index on
// river_job.metadata, which made inserts about 40% slower in the benchmark;
// one tag rather than two (with the event ID): River checks every tag with a
// regular expression, 15% of the relay's CPU for two tags per job. Which
// event a job is for is in the event's fanout, and in the args of handler
// jobs. The caller's opts are copied, never modified.
//
// traceContext, when set, is the carried event's recording trace context: it
// is added to the job's metadata, where otelriver finds it.
func (j *plannedJob) insertOpts(traceContext []byte) *river.InsertOpts {
	var opts river.InsertOpts
	if j.opts != nil {
		opts = *j.opts
	}
	if traceContext != nil {
		opts.Metadata = withTraceMetadata(opts.Metadata, traceContext)
	}
	if j.chain != nil && !j.chain.head {
		opts.Pending = true // released when the job before it completes
	}
	own := opts.Tags
	if own == nil {
		// River would take the args' own tags when opts has none: keep them.
		own = j.tags
	}
	// Only a job in a chain is tagged ordered: an ordered subscriber's job
	// of an event with no subject is an unordered job, completed by River.
	subTags := j.sub.tags
	if j.chain != nil {
		subTags = j.sub.chainTags
	}
	if len(own) == 0 {
		opts.Tags = subTags
		return &opts
	}
	opts.Tags = append(append(make([]string, 0, len(own)+len(subTags)), own...), subTags...)
	return &opts
}
