package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/standmeet/events/internal/engine"
)

// instrumentationName names the library's meter and tracer.
const instrumentationName = "github.com/standmeet/events"

// Metric names. Where an OpenTelemetry messaging semantic convention fits it
// is used (a relay "sends" one message per River job it inserts); the others
// carry an "events." prefix. Durations are in seconds.
const (
	MetricJobsInserted    = "messaging.client.sent.messages"
	MetricFannedOut       = "events.fanned_out"
	MetricCoalesced       = "events.coalesced"
	MetricRoundDuration   = "events.round.duration"
	MetricBatchSize       = "events.batch.size"
	MetricFailures        = "events.failures"
	MetricPoisoned        = "events.poisoned"
	MetricReconnects      = "events.listener.reconnects"
	MetricBacklog         = "events.backlog"
	MetricLag             = "events.lag"
	MetricReceipts        = "events.receipts"
	MetricReceiptDuration = "events.receipt.duration"
)

// newRelayMetrics makes a relay's instruments (the engine's Metrics);
// no-ops when mp is nil.
func newRelayMetrics(mp metric.MeterProvider) (engine.Metrics, metric.Meter, error) {
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	m := mp.Meter(instrumentationName)
	var (
		rm   engine.Metrics
		errs []error
	)
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	rm.Jobs = counter(MetricJobsInserted, "{message}", "River jobs the relay inserted, by subscriber.")
	rm.Fanned = counter(MetricFannedOut, "{event}", "Events the relay fanned out (stamped).")
	rm.Coalesced = counter(MetricCoalesced, "{event}", "Events folded into a later event's job by a coalescing subscriber.")
	rm.Failures = counter(MetricFailures, "{failure}", "Failed attempts charged to events.")
	rm.Poisoned = counter(MetricPoisoned, "{event}", "Events the relay poisoned.")
	rm.Reconnects = counter(MetricReconnects, "{reconnect}", "Times the listening connection was re-established.")
	var err error
	rm.RoundDuration, err = m.Float64Histogram(MetricRoundDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of the relay's rounds (claim, insert, stamp, commit)."),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
	errs = append(errs, err)
	rm.BatchSize, err = m.Int64Histogram(MetricBatchSize, metric.WithUnit("{event}"),
		metric.WithDescription("Events claimed per round."),
		metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000))
	errs = append(errs, err)
	for _, err := range errs {
		if err != nil {
			return engine.Metrics{}, nil, err
		}
	}
	return rm, m, nil
}

// awaiterMetrics are an awaiter's instruments.
type awaiterMetrics struct {
	receipts metric.Int64Counter
	duration metric.Float64Histogram
}

func newAwaiterMetrics(mp metric.MeterProvider) (awaiterMetrics, error) {
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	m := mp.Meter(instrumentationName)
	receipts, err := m.Int64Counter(MetricReceipts, metric.WithUnit("{receipt}"),
		metric.WithDescription("AwaitFanout calls, by outcome."))
	if err != nil {
		return awaiterMetrics{}, err
	}
	duration, err := m.Float64Histogram(MetricReceiptDuration, metric.WithUnit("s"),
		metric.WithDescription("How long AwaitFanout waited."))
	if err != nil {
		return awaiterMetrics{}, err
	}
	return awaiterMetrics{receipts: receipts, duration: duration}, nil
}

func outcome(err error) metric.MeasurementOption {
	o := "ok"
	switch {
	case err == nil:
	case errors.Is(err, ErrPoisoned):
		o = "poisoned"
	case errors.Is(err, ErrNotFound):
		o = "not_found"
	default:
		o = "error"
	}
	return metric.WithAttributes(attribute.String("outcome", o))
}

// traceContextOf returns the W3C trace context of ctx's span as the JSON
// object that otelriver reads from job metadata ({"traceparent": …,
// "tracestate": …}), or nil when ctx carries no valid span: such events
// store nothing and cost nothing.
func traceContextOf(ctx context.Context) *string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	b, err := json.Marshal(carrier)
	if err != nil {
		return nil
	}
	s := string(b)
	return &s
}

// Keys of the private copy of the trace context in job metadata, which
// TraceMiddleware restores after otelriver's insert middleware has written
// its own span's over "traceparent" and "tracestate".
const (
	metaTraceparent = "events.traceparent"
	metaTracestate  = "events.tracestate"
)

// TraceMiddleware keeps, on the jobs a relay inserts, the trace context of
// the request that recorded their event, so that otelriver's work span links
// to that request. otelriver's insert middleware (with
// EnableTracePropagation) writes its own insert span's context over the
// job's "traceparent"; list TraceMiddleware after it in
// river.Config.Middleware, and it restores the recording request's context
// before the insert. It touches no other job. Without it, the chain still
// holds through one more link: the work span links to otelriver's insert
// span, a child of the relay's "events.fanout" span, which links to every
// recording request.
type TraceMiddleware struct {
	river.MiddlewareDefaults
}

var _ rivertype.JobInsertMiddleware = (*TraceMiddleware)(nil)

// InsertMany restores the recording request's trace context on the relay's
// jobs, then inserts.
func (*TraceMiddleware) InsertMany(ctx context.Context, manyParams []*rivertype.JobInsertParams,
	doInner func(context.Context) ([]*rivertype.JobInsertResult, error),
) ([]*rivertype.JobInsertResult, error) {
	for _, p := range manyParams {
		if !bytes.Contains(p.Metadata, []byte(metaTraceparent)) {
			continue
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(p.Metadata, &m) != nil {
			continue
		}
		for private, public := range map[string]string{metaTraceparent: "traceparent", metaTracestate: "tracestate"} {
			if v, ok := m[private]; ok {
				m[public] = v
			}
		}
		if b, err := json.Marshal(m); err == nil {
			p.Metadata = b
		}
	}
	return doInner(ctx)
}

func newTracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = tracenoop.NewTracerProvider()
	}
	return tp.Tracer(instrumentationName)
}
