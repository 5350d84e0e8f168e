package engine

import (
	"context"
	"runtime/debug"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/standmeet/events/internal/maintenance"
)

// The background duties of a run (package maintenance): retention,
// heartbeats, and the sweeps of ordered subscribers' chains.

// pruner runs retention (internal/maintenance's Pruner) every
// RetentionInterval until the relay stops: one relay of the schema at a
// time, batch by batch, a batch a second while the relay drains a backlog.
func (r *Relay) pruner(ctx context.Context) {
	p := &maintenance.Pruner{
		DB:         r.pool,
		SQL:        r.sql,
		Retention:  r.config.Retention,
		Interval:   r.config.RetentionInterval,
		Busy:       func() bool { return r.busy.Load() || r.owedBusy.Load() },
		Logger:     r.config.Logger,
		OnPass:     r.Hooks.PrunePass,
		OnBatch:    r.Hooks.Pruning,
		OnTruncate: r.Hooks.Truncated,
	}
	p.Run(ctx, r.run.Stopping())
}

// libraryVersion is this library's module version in the running binary.
var libraryVersion = sync.OnceValue(func() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	const path = "github.com/standmeet/events"
	if info.Main.Path == path {
		return info.Main.Version
	}
	for _, d := range info.Deps {
		if d.Path == path {
			return d.Version
		}
	}
	return ""
})

// heartbeater reports in until the relay stops, then marks the run stopped.
func (r *Relay) heartbeater(ctx context.Context) {
	r.beat.Load().Run(ctx, r.run.Stopping())
}

// newHeartbeat returns the heartbeat of a new run, which reports the relay's
// health and claim floor.
func (r *Relay) newHeartbeat() *maintenance.Heartbeat {
	return &maintenance.Heartbeat{
		DB:          r.pool,
		SQL:         r.sql,
		RunID:       uuid.Must(uuid.NewV7()),
		Version:     libraryVersion(),
		ClientID:    r.client.ID(),
		OrphanAfter: r.config.OrphanAfter,
		Logger:      r.config.Logger,
		Report: func() maintenance.Beat {
			var lastRound *time.Time
			if ns := r.lastRound.Load(); ns != 0 {
				at := time.Unix(0, ns)
				lastRound = &at
			}
			var floor *int64
			if f := r.claimFloor; f != nil {
				floor = f.Stored()
			}
			return maintenance.Beat{
				Subscribers: r.known, Listening: r.Listening(), PollOnly: r.config.PollOnly,
				ConsecutiveFailures: r.Failures(), LastRound: lastRound, ClaimFloor: floor,
			}
		},
	}
}

// orderedSubs returns the names of the run's ordered subscribers, and those
// of them that continue past a discarded head.
func (r *Relay) orderedSubs() (subs, cont []string) {
	for _, s := range r.active {
		if !s.Ordered {
			continue
		}
		subs = append(subs, s.Name)
		if s.Continue {
			cont = append(cont, s.Name)
		}
	}
	return subs, cont
}

// chainSweeper looks after the run's chains until the relay stops
// (internal/maintenance's ChainSweeper): River tells no one when it
// discards a job after its last attempt, a process may die while its worker
// runs a chain's head, and the chains of subscribers this release serves
// unordered, or retired ones, are released.
func (r *Relay) chainSweeper(ctx context.Context) {
	subs, cont := r.orderedSubs()
	var unordered []string
	for _, s := range r.active {
		if !s.Ordered {
			unordered = append(unordered, s.Name)
		}
	}
	s := &maintenance.ChainSweeper{
		DB: r.pool, SQL: r.sql, Ordered: subs, Continue: cont, Unordered: unordered, Tag: TagOrdered,
		DeadWorkerAfter: r.Hooks.DeadWorkerAfter, Logger: r.config.Logger, OnRescued: r.Hooks.Rescued, Stopping: r.run.Stopping(),
	}
	s.Run(ctx)
}
