package events

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/standmeet/events/internal/maintenance"
)

// Heartbeats: every running relay reports in (internal/maintenance's
// Heartbeat), never in a host's transaction: which subscribers it serves,
// whether it listens, how it fares; the same statement stamps
// last_served_at on the subscribers it serves and reads back the orphaned
// ones. ListRelays is the operator's view of them.

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
		OrphanAfter: r.config.Outbox.OrphanAfter,
		Logger:      r.logger,
		Report: func() maintenance.Beat {
			var lastRound *time.Time
			if ns := r.lastRound.Load(); ns != 0 {
				at := time.Unix(0, ns)
				lastRound = &at
			}
			h := r.Health()
			var floor *int64
			if f := r.claimFloor; f != nil {
				floor = f.Stored()
			}
			return maintenance.Beat{
				Subscribers: r.known, Listening: h.Listening, PollOnly: h.PollOnly,
				ConsecutiveFailures: h.ConsecutiveFailures, LastRound: lastRound, ClaimFloor: floor,
			}
		},
	}
}
