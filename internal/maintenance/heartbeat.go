package maintenance

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/standmeet/events/internal/startstop"
	"github.com/standmeet/events/internal/statements"
)

// HeartbeatInterval is how often a relay reports in (more often with a
// short OrphanAfter).
const HeartbeatInterval = 5 * time.Second

// Querier runs statements: a *pgxpool.Pool.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beat is the relay's state as one heartbeat reports it.
type Beat struct {
	Subscribers         []string // the subscribers it serves
	Listening, PollOnly bool
	ConsecutiveFailures int
	LastRound           *time.Time // nil: it has fanned nothing out yet
	ClaimFloor          *int64     // nil: none yet
}

// Heartbeat reports one run of a relay in: every beat writes its row of
// outbox_relays in a statement of its own (which subscribers it serves,
// whether it listens, how it fares), stamps last_served_at on the
// subscribers it serves, and reads back the orphaned ones: registered,
// active, and served by no relay for OrphanAfter. An orphan's deliveries
// stay owed (and keep their events from retention) until a release that
// has it runs again, or it is retired. When the run stops, its row is
// marked stopped.
type Heartbeat struct {
	DB          Querier
	SQL         *statements.Set
	RunID       uuid.UUID // one run of a relay
	Version     string    // the library's, in this build
	ClientID    string    // the River client's
	OrphanAfter time.Duration
	// Report returns the relay's state now.
	Report func() Beat
	// RoundsEnded, if set, waits until the relay's rounds have ended: the
	// run is marked stopped after them, with the floor they left.
	RoundsEnded func()
	Logger      *slog.Logger

	orphaned atomic.Pointer[[]string]
}

// every is how often the run reports in: every HeartbeatInterval, or a
// third of OrphanAfter when that is shorter.
func (h *Heartbeat) every() time.Duration {
	return min(HeartbeatInterval, max(h.OrphanAfter/3, 10*time.Millisecond))
}

// Run reports in at once and then every every() until stopping closes or
// ctx ends, then marks the run stopped.
func (h *Heartbeat) Run(ctx context.Context, stopping <-chan struct{}) {
	startstop.Every(ctx, stopping, 0, h.every(), func() {
		if err := h.Beat(ctx); err != nil && ctx.Err() == nil {
			h.Logger.WarnContext(ctx, "events: relay heartbeat failed", slog.String("err", err.Error()))
		}
	})
	if h.RoundsEnded != nil {
		h.RoundsEnded()
	}
	// Within a short bound: the relay's context may be gone already.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = h.MarkStopped(ctx)
}

// Beat writes the run's row and reads the orphaned subscribers, warning once
// about each newly orphaned one.
func (h *Heartbeat) Beat(ctx context.Context) error {
	host, _ := os.Hostname()
	b := h.Report()
	if b.Subscribers == nil {
		b.Subscribers = []string{} // none, not NULL
	}
	var orphaned []string
	err := h.DB.QueryRow(ctx, h.SQL.Heartbeat, h.RunID, host, os.Getpid(), h.Version, b.Subscribers,
		b.Listening, b.PollOnly, b.ConsecutiveFailures, b.LastRound, h.OrphanAfter.Microseconds(), h.ClientID,
		b.ClaimFloor).Scan(&orphaned)
	if err != nil {
		return err
	}
	before := h.orphaned.Load()
	for _, name := range orphaned {
		if before == nil || !slices.Contains(*before, name) {
			h.Logger.WarnContext(ctx, "events: subscriber is orphaned: no running relay has served it; its events stay owed to it"+
				" and are kept from retention. Deploy a release that has it, or retire it with Outbox.RetireSubscriber",
				slog.String("subscriber", name), slog.Duration("orphan_after", h.OrphanAfter))
		}
	}
	if len(orphaned) == 0 {
		orphaned = nil
	}
	h.orphaned.Store(&orphaned)
	return nil
}

// Orphaned returns the orphaned subscribers as the last beat read them (nil:
// none, or no beat yet).
func (h *Heartbeat) Orphaned() []string {
	if o := h.orphaned.Load(); o != nil {
		return slices.Clone(*o)
	}
	return nil
}

// MarkStopped records that the run stopped, with its claim floor (a run
// already marked keeps the time it stopped).
func (h *Heartbeat) MarkStopped(ctx context.Context) error {
	_, err := h.DB.Exec(ctx, h.SQL.RelayStopped, h.RunID, h.Report().ClaimFloor)
	return err
}
