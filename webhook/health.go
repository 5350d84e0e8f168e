package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/standmeet/events/internal/backoff"
)

// Defaults of the circuit breaker (Config.BreakerThreshold,
// Config.BreakerInterval).
const (
	BreakerThresholdDefault = 5
	BreakerIntervalDefault  = 30 * time.Second
)

// Breaker states, as EndpointHealth reports them.
const (
	BreakerClosed   = "closed"    // deliveries go out
	BreakerOpen     = "open"      // deliveries wait until OpenUntil
	BreakerHalfOpen = "half-open" // one probe may go (or is out); the others wait for its answer
)

// HealthWindow is how far back Health looks in the attempt log.
const HealthWindow = time.Hour

// The circuit breaker and the rate limit keep their state in one row per
// endpoint (webhook_endpoint_health), shared by every process:
//
//   - failures counts consecutive failed requests; at BreakerThreshold the
//     breaker opens until open_until (now + BreakerInterval). After that, the
//     first delivery to come takes a lease on the probe (probe_until: the
//     endpoint's timeout and a margin) and goes; the others wait. The
//     probe's success closes the breaker; its failure opens it for another
//     interval. A dead endpoint costs one request per interval, however
//     many deliveries wait for it.
//   - next_slot is the rate limit's schedule (GCRA): a delivery reserves the
//     slot greatest(next_slot, now) and moves next_slot one 1/RateLimit
//     later, in the same UPDATE … RETURNING; it sends at its slot, sleeping
//     if it is close (slotWindow), snoozing with the slot in its job's
//     metadata if not.
//
// Waiting never counts as a try: no request was made.

// health is what a delivery reads of its endpoint's breaker.
type health struct {
	failures              int
	openUntil, probeUntil *time.Time
}

// Rate limit tuning: a slot nearer than slotWindow is waited for in the
// worker; a snoozed delivery sends when River wakes it (at its
// FetchPollInterval, later under load), however late: its slot was reserved,
// so the average rate holds, and a burst is at most what one poll interval
// of the rate reserved.
const (
	slotWindow = 250 * time.Millisecond
	metaSlot   = "webhook_slot" // reserved slot, Unix microseconds
)

// admission is the breaker's and the rate limit's answer to a delivery.
type admission struct {
	probe bool          // the half-open breaker's probe
	wait  time.Duration // > 0: snooze this long, sending nothing
}

// admit asks the breaker and the rate limit whether a delivery may go now,
// reserving its rate-limit slot (sleeping for it when it is close).
func (w *Webhooks) admit(ctx context.Context, ep *Endpoint, job *river.Job[DeliverArgs]) (admission, error) {
	closed := ep.health.failures < w.config.BreakerThreshold
	if closed && ep.RateLimit <= 0 {
		return admission{}, nil // the common case costs no statement
	}
	now := time.Now()
	if slot := reservedSlot(job.Metadata); !slot.IsZero() {
		_ = river.MetadataSet(ctx, metaSlot, 0)
		switch {
		case now.Before(slot.Add(-slotWindow)):
			_ = river.MetadataSet(ctx, metaSlot, slot.UnixMicro())
			return admission{wait: slot.Sub(now) - slotWindow/2}, nil
		case closed:
			// At its slot, or late (River woke it at its next poll): a
			// reserved slot is never dropped, so late wake-ups cost no
			// rate; deliveries woken together by one poll send together,
			// at most a poll interval's worth of the rate.
			return admission{}, sleepUntil(ctx, slot)
		}
		// The breaker opened meanwhile: the slot is lost.
	}
	var interval time.Duration
	if ep.RateLimit > 0 {
		interval = time.Duration(float64(time.Second) / ep.RateLimit)
	}
	lease := ep.Timeout + 5*time.Second
	var (
		probe bool
		slot  time.Time
	)
	err := w.pool.QueryRow(ctx, w.sql.Admit, ep.ID, w.config.BreakerThreshold, lease.Microseconds(), interval.Microseconds()).Scan(&probe, &slot)
	if errors.Is(err, pgx.ErrNoRows) {
		return w.breakerWait(ctx, ep)
	}
	if err != nil {
		return admission{}, err
	}
	if d := time.Until(slot); d > slotWindow {
		if err := river.MetadataSet(ctx, metaSlot, slot.UnixMicro()); err != nil {
			return admission{}, err
		}
		return admission{probe: probe, wait: d - slotWindow/2}, nil
	}
	return admission{probe: probe}, sleepUntil(ctx, slot)
}

// breakerWait is how long a delivery waits for an open breaker, or for the
// half-open breaker's probe: until the breaker may probe again, spread over
// one more interval so that waiting deliveries do not all come back at once.
func (w *Webhooks) breakerWait(ctx context.Context, ep *Endpoint) (admission, error) {
	var openUntil, probeUntil *time.Time
	if err := w.pool.QueryRow(ctx, w.sql.BreakerState, ep.ID).
		Scan(&openUntil, &probeUntil); err != nil {
		return admission{}, err
	}
	now := time.Now()
	until := now
	if openUntil != nil && openUntil.After(until) {
		until = *openUntil
	}
	if probeUntil != nil && probeUntil.After(until) {
		until = *probeUntil
	}
	spread := time.Duration(rand.Int64N(int64(w.config.BreakerInterval) + 1))
	return admission{wait: max(until.Sub(now), 100*time.Millisecond) + spread}, nil
}

func reservedSlot(metadata []byte) time.Time {
	var m struct {
		Slot int64 `json:"webhook_slot"`
	}
	if json.Unmarshal(metadata, &m) != nil || m.Slot == 0 {
		return time.Time{}
	}
	return time.UnixMicro(m.Slot)
}

func sleepUntil(ctx context.Context, t time.Time) error {
	if d := time.Until(t); d > 0 {
		return backoff.Sleep(ctx, d)
	}
	return nil
}

// recordHealth updates the breaker in tx after a request: success closes
// it, a failure counts and, at the threshold, opens it for an interval. A
// probe's failure ends its lease; another delivery's leaves it alone.
func (w *Webhooks) recordHealth(ctx context.Context, tx pgx.Tx, ep *Endpoint, success, probe bool) error {
	var err error
	if success {
		_, err = tx.Exec(ctx, w.sql.BreakerClose, ep.ID)
	} else {
		_, err = tx.Exec(ctx, w.sql.BreakerFail, ep.ID, w.config.BreakerThreshold, w.config.BreakerInterval.Microseconds(), probe)
	}
	return err
}

// EndpointHealth is an endpoint's recent record and its breaker, for
// operators.
type EndpointHealth struct {
	EndpointID uuid.UUID
	// Attempts and Successes count the requests of the last HealthWindow
	// (attempts that sent nothing, for want of a secret say, are left out);
	// SuccessRate is Successes/Attempts, 0 without attempts.
	Attempts    int
	Successes   int
	SuccessRate float64
	// Latency of those requests, answered or not: median, 95th and 99th
	// percentiles.
	LatencyP50, LatencyP95, LatencyP99 time.Duration
	// Breaker is BreakerClosed, BreakerOpen or BreakerHalfOpen;
	// ConsecutiveFailures the failures since the last success; OpenUntil,
	// when open, is the earliest time of the next probe.
	Breaker             string
	ConsecutiveFailures int
	OpenUntil           time.Time
	// RateLimit is the endpoint's requests per second; 0: none.
	RateLimit float64
}

// Health returns the health of the endpoints with the given IDs (all of
// them, by ID, when none is given) over the last HealthWindow: success
// rate, latency percentiles, and the circuit breaker's state. It reads the
// attempt log by its (endpoint, time) index.
func (w *Webhooks) Health(ctx context.Context, ids ...uuid.UUID) ([]EndpointHealth, error) {
	if ids == nil {
		ids = []uuid.UUID{}
	}
	rows, err := w.pool.Query(ctx, w.sql.Health, ids, HealthWindow.Microseconds())
	if err != nil {
		return nil, err
	}
	now := time.Now()
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (EndpointHealth, error) {
		var (
			h                     EndpointHealth
			openUntil, probeUntil *time.Time
			p50, p95, p99         float64
		)
		if err := row.Scan(&h.EndpointID, &h.RateLimit, &h.ConsecutiveFailures, &openUntil, &probeUntil,
			&h.Attempts, &h.Successes, &p50, &p95, &p99); err != nil {
			return h, err
		}
		if h.Attempts > 0 {
			h.SuccessRate = float64(h.Successes) / float64(h.Attempts)
		}
		ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
		h.LatencyP50, h.LatencyP95, h.LatencyP99 = ms(p50), ms(p95), ms(p99)
		switch {
		case h.ConsecutiveFailures < w.config.BreakerThreshold:
			h.Breaker = BreakerClosed
		case openUntil != nil && openUntil.After(now):
			h.Breaker, h.OpenUntil = BreakerOpen, *openUntil
		default:
			h.Breaker = BreakerHalfOpen
		}
		_ = probeUntil
		return h, nil
	})
}
