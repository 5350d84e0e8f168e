package events

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
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
