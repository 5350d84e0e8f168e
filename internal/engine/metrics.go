package engine

import (
	"context"
	"encoding/json"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Metrics are a relay's instruments, made by the root package (which names
// them); no-ops when it has no MeterProvider.
type Metrics struct {
	Jobs, Fanned, Coalesced, Failures, Poisoned, Reconnects metric.Int64Counter
	RoundDuration                                           metric.Float64Histogram
	BatchSize                                               metric.Int64Histogram
}

// Attributes of the engine's measurements and spans.
const (
	AttrSubscriber         = "events.subscriber"
	AttrLane               = "events.lane"
	attrMessagingSystem    = "messaging.system"
	attrBatchMessageCount  = "messaging.batch.message_count"
	attrMessagingOperation = "messaging.operation.type"
)

// startRoundSpan starts the span of a round: "events.fanout", kind producer,
// linked to the recording spans of the batch's events.
func (r *Relay) startRoundSpan(ctx context.Context, batch []claimedRow) (context.Context, trace.Span) {
	var links []trace.Link
	for _, c := range batch {
		if sc := spanContextOf(c.traceContext); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return r.config.Tracer.Start(ctx, "events.fanout", trace.WithSpanKind(trace.SpanKindProducer), trace.WithLinks(links...),
		trace.WithAttributes(attribute.Int(attrBatchMessageCount, len(batch)), attribute.String(attrMessagingSystem, "river"),
			attribute.String(attrMessagingOperation, "send")))
}

// seconds converts a duration for a histogram in seconds.
func seconds(d time.Duration) float64 { return d.Seconds() }

// spanContextOf reads back a stored trace context.
func spanContextOf(tc []byte) trace.SpanContext {
	var carrier propagation.MapCarrier
	if len(tc) == 0 || json.Unmarshal(tc, &carrier) != nil {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
}

// withTraceMetadata returns the job metadata (a JSON object, or empty) with
// the recording request's trace context tc (a JSON object) added twice: as
// "traceparent"/"tracestate", the form otelriver reads, and as a private
// copy for TraceMiddleware.
func withTraceMetadata(metadata, tc []byte) []byte {
	var carrier map[string]string
	if json.Unmarshal(tc, &carrier) != nil {
		return metadata
	}
	m := map[string]any{}
	if len(metadata) > 0 && json.Unmarshal(metadata, &m) != nil {
		return metadata // not an object: leave the host's metadata alone
	}
	for k, v := range carrier {
		m[k] = v
		m["events."+k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		return metadata
	}
	return b
}
