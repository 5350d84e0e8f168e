package events

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// Stats is how the outbox stands, as [Outbox.GetStats] reports it.
type Stats struct {
	// Pending counts events not yet fanned out (and not poisoned), the
	// retrying ones included.
	Pending int64
	// Lag is the age of the oldest pending event: how far behind the relays
	// are. Zero when nothing is pending.
	Lag time.Duration
	// Retrying counts pending events that failed at least once and wait for
	// their next attempt.
	Retrying int64
	// Poisoned counts events set aside until [Outbox.Requeue] or
	// [Outbox.Discard]: as a whole, or for at least one subscriber (as
	// [Outbox.ListEvents] lists them with [EventPoisoned]).
	Poisoned int64
	// CatchingUp counts fanned-out events whose catch_up list, written
	// during a rolling deploy by a relay of a release that kept no state per
	// delivery, no relay has yet turned into owed deliveries.
	CatchingUp int64
	// Owed counts deliveries still to be made: retrying after a failure of
	// the subscriber's Map, owed to a subscriber the stamping relay did not
	// know, or to a paused one.
	Owed int64
	// PoisonedDeliveries counts deliveries set aside for their subscriber
	// alone, until [Outbox.Requeue] or [Outbox.Discard].
	PoisonedDeliveries int64
	// Orphaned names the registered, active subscribers that no running
	// relay has served for Outbox.OrphanAfter (default OrphanAfterDefault):
	// their deliveries pile up. Deploy a release that has them, or
	// [Outbox.RetireSubscriber].
	Orphaned []string
	// Paused names the subscribers paused by [Outbox.PauseSubscriber].
	Paused []string
	// FannedOutLastMinute counts events fanned out in the last minute.
	FannedOutLastMinute int64
	// BlockedChains counts the subjects of ordered subscribers that are
	// blocked: the job at the head ended discarded, cancelled or deleted,
	// and the jobs behind it wait for [Outbox.ResumeChain] or
	// [Outbox.SkipChain] (see [Subscriber.Ordered]).
	BlockedChains int64
}

// GetStats reports how the outbox stands, in one query whose every figure comes
// from a small partial index, so it stays fast on a table of millions of
// rows: fit for a readiness probe, an alert or a dashboard.
func (o Outbox) GetStats(ctx context.Context, db DB) (Stats, error) {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return Stats{}, err
	}
	var (
		st  Stats
		lag *float64
	)
	if err := db.QueryRow(ctx, sql.Stats, cmp.Or(o.OrphanAfter, OrphanAfterDefault).Microseconds()).Scan(
		&st.Pending, &st.Retrying, &st.Poisoned, &st.CatchingUp, &st.FannedOutLastMinute, &lag,
		&st.Owed, &st.PoisonedDeliveries, &st.Orphaned, &st.Paused, &st.BlockedChains); err != nil {
		return Stats{}, fmt.Errorf("events: stats: %w", err)
	}
	if len(st.Orphaned) == 0 {
		st.Orphaned = nil
	}
	if len(st.Paused) == 0 {
		st.Paused = nil
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
	// Orphaned names the registered, active subscribers that no running
	// relay has served for RelayConfig.OrphanAfter, as this relay's last
	// heartbeat read them (every few seconds): deploy a release that has
	// them, or [Outbox.RetireSubscriber]. It does not make the relay unhealthy.
	Orphaned []string
}

// Health reports the relay's state. It reads no database: combine it with
// [Outbox.GetStats] for the outbox's.
func (r *Relay) Health() Health {
	// Not the OnPoison calls a stopped run may still be finishing: Running is
	// about serving events.
	running := r.svc.Running()
	var orphaned []string
	if hb := r.eng.Heartbeat(); hb != nil {
		orphaned = hb.Orphaned()
	}
	return Health{
		Running:             running,
		Listening:           running && r.eng.Listening(),
		PollOnly:            r.config.Listener.PollOnly,
		LastSuccessAt:       r.eng.LastSuccess(),
		ConsecutiveFailures: r.eng.Failures(),
		Orphaned:            orphaned,
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

// registerGauges reports the backlog and the lag, read with GetStats when the
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
		st, err := o.GetStats(ctx, r.pool)
		if err != nil {
			return err
		}
		obs.ObserveInt64(backlog, st.Pending)
		obs.ObserveFloat64(lag, st.Lag.Seconds())
		return nil
	}, backlog, lag)
}
