package events

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// OutboxStats is how the outbox stands, as [Stats] reports it.
type OutboxStats struct {
	// Pending counts events not yet fanned out (and not poisoned), the
	// retrying ones included.
	Pending int64
	// Lag is the age of the oldest pending event: how far behind the relays
	// are. Zero when nothing is pending.
	Lag time.Duration
	// Retrying counts pending events that failed at least once and wait for
	// their next attempt.
	Retrying int64
	// Poisoned counts events set aside until [Requeue] or [Discard].
	Poisoned int64
	// CatchingUp counts fanned-out events that a subscriber added by a
	// rolling deploy has still to receive.
	CatchingUp int64
	// FannedOutLastMinute counts events fanned out in the last minute.
	FannedOutLastMinute int64
}

// Stats reports how the outbox stands, in one query whose every figure comes
// from a small partial index, so it stays fast on a table of millions of
// rows: fit for a readiness probe, an alert or a dashboard.
func Stats(ctx context.Context, db DB) (OutboxStats, error) {
	return Outbox{}.Stats(ctx, db)
}

// Stats is [Stats] in o's schema.
func (o Outbox) Stats(ctx context.Context, db DB) (OutboxStats, error) {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return OutboxStats{}, err
	}
	var (
		st  OutboxStats
		lag *float64
	)
	if err := db.QueryRow(ctx, sql.Stats).Scan(&st.Pending, &st.Retrying, &st.Poisoned, &st.CatchingUp,
		&st.FannedOutLastMinute, &lag); err != nil {
		return OutboxStats{}, fmt.Errorf("events: stats: %w", err)
	}
	if lag != nil {
		st.Lag = time.Duration(*lag * float64(time.Second))
	}
	return st, nil
}

// Health is a relay's own view of itself, as [Relay.Health] reports it.
type Health struct {
	// Running is true between Start and Stop (or the end of Start's
	// context).
	Running bool
	// Listening is true while the listening connection is up; always false
	// with [ListenerConfig.PollOnly].
	Listening bool
	// PollOnly is [ListenerConfig.PollOnly].
	PollOnly bool
	// LastSuccessAt is when a round or a poll last reached the database.
	LastSuccessAt time.Time
	// ConsecutiveFailures counts the rounds or polls that failed since then.
	ConsecutiveFailures int
}

// Health reports the relay's state. It reads no database: combine it with
// [Stats] for the outbox's.
func (r *Relay) Health() Health {
	r.mu.RLock()
	// Not the OnPoison calls a stopped run may still be finishing: Running is
	// about serving events.
	running := r.running && r.loopDone != nil && !isClosed(r.loopDone)
	r.mu.RUnlock()
	return Health{
		Running:             running,
		Listening:           running && !r.config.Listener.PollOnly && r.listening.Load(),
		PollOnly:            r.config.Listener.PollOnly,
		LastSuccessAt:       time.Unix(0, r.lastSuccess.Load()),
		ConsecutiveFailures: int(r.failing.Load()),
	}
}

// Healthy reports whether the relay is fit to serve, for a readiness or
// liveness probe: it runs, it listens (or polls only), its last failure is
// behind it, and it reached the database within three poll intervals (at
// least 10 seconds).
func (r *Relay) Healthy() bool {
	h := r.Health()
	fresh := max(3*r.config.Listener.PollInterval, 10*time.Second)
	return h.Running && (h.Listening || h.PollOnly) && h.ConsecutiveFailures == 0 && time.Since(h.LastSuccessAt) < fresh
}

// registerGauges reports the backlog and the lag, read with Stats when the
// metrics are collected.
func (r *Relay) registerGauges() (metric.Registration, error) {
	backlog, err := r.meter.Int64ObservableGauge(MetricBacklog, metric.WithUnit("{event}"),
		metric.WithDescription("Events not yet fanned out."))
	if err != nil {
		return nil, err
	}
	lag, err := r.meter.Float64ObservableGauge(MetricLag, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest event not yet fanned out."))
	if err != nil {
		return nil, err
	}
	o := Outbox{Schema: r.sql.Schema}
	return r.meter.RegisterCallback(func(ctx context.Context, obs metric.Observer) error {
		st, err := o.Stats(ctx, r.pool)
		if err != nil {
			return err
		}
		obs.ObserveInt64(backlog, st.Pending)
		obs.ObserveFloat64(lag, st.Lag.Seconds())
		return nil
	}, backlog, lag)
}
