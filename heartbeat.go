package events

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/standmeet/events/internal/startstop"
)

// Heartbeats. Every running relay writes a row of outbox_relays every
// heartbeatInterval (or more often with a short OrphanAfter), in a statement
// of its own, never in a host's transaction: which subscribers it serves,
// whether it listens, how it fares. The same statement stamps
// last_served_at on the subscribers it serves, and reads back the orphaned
// ones: registered, active, and served by no relay for OrphanAfter. An
// orphan's deliveries stay owed (and keep their events from retention) until a
// release that has it runs again, or it is retired.

// heartbeatInterval is how often a relay reports in.
const heartbeatInterval = 5 * time.Second

// RelayInfo is a relay as it last reported in, as [Outbox.ListRelays] reports it.
type RelayInfo struct {
	// ID identifies one run of a relay (a new one at every Start).
	ID uuid.UUID
	// Host and PID are the process's.
	Host string
	PID  int
	// Version is the library's version in that process's build.
	Version string
	// Subscribers are the subscribers the relay serves.
	Subscribers []string
	// StartedAt is when the run started; LastSeenAt when it last reported
	// in; StoppedAt when it stopped (zero while it runs, or if it died).
	StartedAt, LastSeenAt, StoppedAt time.Time
	// Listening and PollOnly are as in [Health].
	Listening, PollOnly bool
	// ConsecutiveFailures counts its rounds or polls failed in a row.
	ConsecutiveFailures int
	// LastRoundAt is when it last fanned something out; zero if never.
	LastRoundAt time.Time
}

// ListRelays lists the relays that reported in during the last day, the
// running ones and the stopped or dead, oldest first: the operator's view of
// which process serves which subscriber.
func (o Outbox) ListRelays(ctx context.Context, db DB) ([]RelayInfo, error) {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, sql.ListRelays)
	if err != nil {
		return nil, fmt.Errorf("events: list relays: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RelayInfo, error) {
		var (
			ri                 RelayInfo
			stopped, lastRound *time.Time
		)
		err := row.Scan(&ri.ID, &ri.Host, &ri.PID, &ri.Version, &ri.Subscribers, &ri.StartedAt, &ri.LastSeenAt, &stopped,
			&ri.Listening, &ri.PollOnly, &ri.ConsecutiveFailures, &lastRound)
		ri.StoppedAt, ri.LastRoundAt = deref(stopped), deref(lastRound)
		return ri, err
	})
	if err != nil {
		return nil, fmt.Errorf("events: list relays: %w", err)
	}
	return list, nil
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
	every := min(heartbeatInterval, max(r.config.Outbox.OrphanAfter/3, 10*time.Millisecond))
	startstop.Every(ctx, r.run.Stopping(), 0, every, func() {
		if err := r.heartbeat(ctx); err != nil && ctx.Err() == nil {
			r.logger.WarnContext(ctx, "events: relay heartbeat failed", slog.String("err", err.Error()))
		}
	})
	r.markStopped(ctx)
}

// heartbeat writes the relay's row and reads the orphaned subscribers,
// warning once about each newly orphaned one.
func (r *Relay) heartbeat(ctx context.Context) error {
	host, _ := os.Hostname()
	var lastRound *time.Time
	if ns := r.lastRound.Load(); ns != 0 {
		at := time.Unix(0, ns)
		lastRound = &at
	}
	h := r.Health()
	var orphaned []string
	err := r.pool.QueryRow(ctx, r.sql.Heartbeat, r.runID, host, os.Getpid(), libraryVersion(), r.known,
		h.Listening, h.PollOnly, h.ConsecutiveFailures, lastRound, r.config.Outbox.OrphanAfter.Microseconds(), r.client.ID(),
		r.claimFloor.Stored()).Scan(&orphaned)
	if err != nil {
		return err
	}
	before := r.orphaned.Load()
	for _, name := range orphaned {
		if before == nil || !slices.Contains(*before, name) {
			r.logger.WarnContext(ctx, "events: subscriber is orphaned: no running relay has served it; its events stay owed to it"+
				" and are kept from retention. Deploy a release that has it, or retire it with Outbox.RetireSubscriber",
				slog.String("subscriber", name), slog.Duration("orphan_after", r.config.Outbox.OrphanAfter))
		}
	}
	if len(orphaned) == 0 {
		orphaned = nil
	}
	r.orphaned.Store(&orphaned)
	return nil
}

// markStopped records that the run stopped, within a short bound: the
// relay's context may be gone already.
func (r *Relay) markStopped(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_, _ = r.pool.Exec(ctx, r.sql.RelayStopped, r.runID, r.claimFloor.Stored())
}
