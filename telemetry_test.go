package events

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/riverqueue/rivercontrib/otelriver"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/standmeet/events/internal/engine"
)

// sums reads the counters and histogram counts of rm by name, and by
// subscriber or outcome where they carry one.
func sums(rm metricdata.ResourceMetrics) map[string]int64 {
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[m.Name] += p.Value
					for _, key := range []attribute.Key{engine.AttrSubscriber, "outcome"} {
						if v, ok := p.Attributes.Value(key); ok {
							out[m.Name+"/"+v.AsString()] += p.Value
						}
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[m.Name] += int64(p.Count)
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					out[m.Name] += int64(p.Count)
					out[m.Name+".sum"] += p.Sum
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[m.Name] = p.Value
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					out[m.Name] = int64(p.Value)
				}
			}
		}
	}
	return out
}

// The relay's and the awaiter's metrics, read with the SDK's in-memory
// reader, count exactly what the test did.
func TestMetricsCountWhatHappened(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	broken := Subscriber{Name: "broken", Types: []string{"bad"},
		Map: func(context.Context, Event) (river.JobArgs, *river.InsertOpts, error) {
			return nil, nil, errors.New("no")
		}}
	b := setup(t, setupOpts{config: &RelayConfig{MeterProvider: mp, MaxAttempts: 2, RetryBackoff: time.Millisecond, MaxRetryBackoff: time.Millisecond}},
		mapSub("audit", false, "good"), mapSub("search", true, "good"), broken)
	// 10 events of 2 subjects in one batch, and one that is poisoned for its
	// one subscriber.
	es := make([]Event, 10)
	for i := range es {
		es[i] = Event{Type: "good", Subject: []string{"a", "b"}[i%2]}
	}
	es = b.record(t, es...)
	bad := b.record(t, Event{Type: "bad"})[0]
	// Before the relay runs, the backlog gauge sees all 11.
	b.start(t)
	a := startAwaiter(t, b, &AwaiterConfig{MeterProvider: mp})
	_, err := a.AwaitFanout(within(t, 30*time.Second), es[0].ID, es[9].ID)
	require.NoError(t, err)
	rcpt, err := a.AwaitFanout(within(t, 30*time.Second), bad.ID)
	require.NoError(t, err, "fanned out: its pair is owed")
	require.Empty(t, rcpt[0].Fanout)

	var got map[string]int64
	collect := func() {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(ctx, &rm))
		got = sums(rm)
	}
	// The receipts answer once the commits are in; the relay counts just
	// after its own commit returns.
	require.Eventually(t, func() bool { collect(); return got[MetricPoisoned] == 1 && got[MetricFannedOut] == 11 },
		5*time.Second, 5*time.Millisecond, "%v", got)
	require.Equal(t, int64(11), got[MetricFannedOut])
	require.Equal(t, int64(12), got[MetricJobsInserted], "10 audit jobs, 2 coalesced search jobs")
	require.Equal(t, int64(10), got[MetricJobsInserted+"/audit"])
	require.Equal(t, int64(2), got[MetricJobsInserted+"/search"])
	require.Equal(t, int64(8), got[MetricCoalesced+"/search"])
	require.Equal(t, int64(2), got[MetricFailures], "MaxAttempts 2")
	require.Equal(t, int64(1), got[MetricPoisoned])
	require.Equal(t, int64(2), got[MetricReceipts])
	require.Equal(t, int64(2), got[MetricReceipts+"/ok"])
	require.Equal(t, int64(2), got[MetricReceiptDuration])
	require.GreaterOrEqual(t, got[MetricRoundDuration], int64(1))
	require.GreaterOrEqual(t, got[MetricBatchSize+".sum"], int64(11), "every claimed event is in a batch")
	require.Zero(t, got[MetricBacklog], "nothing is pending any more")
	require.Contains(t, got, MetricLag)
}

type tracedArgs struct {
	Subject string `json:"subject"`
}

func (tracedArgs) Kind() string { return "test.traced" }

// A span around Record, otelriver's middleware (then TraceMiddleware) on the
// River client: the handler's work span links to the recording span's
// trace, and the relay's round span links to it too. An event recorded
// without a span gets nothing from the relay in its job's metadata.
func TestTracePropagatesFromRecordToTheHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	defer tp.Shutdown(ctx)

	b := setup(t, setupOpts{config: &RelayConfig{TracerProvider: tp}}, Subscriber{Name: "traced", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			return tracedArgs{Subject: e.Subject}, nil, nil
		}})
	worked := make(chan string, 2)
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(_ context.Context, j *river.Job[tracedArgs]) error {
		worked <- j.Args.Subject
		return nil
	}))
	mw := otelriver.NewMiddleware(&otelriver.MiddlewareConfig{TracerProvider: tp, EnableTracePropagation: true})
	client, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}}, Workers: workers,
		Middleware: []rivertype.Middleware{mw, &TraceMiddleware{}}, FetchPollInterval: 50 * time.Millisecond, FetchCooldown: 10 * time.Millisecond, Logger: quietLogger(),
	})
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	defer client.Stop(ctx)
	require.NoError(t, b.relay.Start(ctx, client))
	defer b.relay.Stop(ctx)

	reqCtx, reqSpan := tp.Tracer("app").Start(ctx, "POST /notes")
	require.NoError(t, pgx.BeginFunc(reqCtx, b.pool, func(tx pgx.Tx) error {
		_, err := Record(reqCtx, tx, Event{Type: "note.changed", Subject: "traced"})
		return err
	}))
	reqSpan.End()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := Record(ctx, tx, Event{Type: "note.changed", Subject: "plain"})
		return err
	}))
	for range 2 {
		select {
		case <-worked:
		case <-time.After(20 * time.Second):
			t.Fatal("the jobs were never worked")
		}
	}
	var plainMeta string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT metadata::text FROM river_job WHERE args->>'subject' = 'plain'").Scan(&plainMeta))
	require.NotContains(t, plainMeta, metaTraceparent, "an event without a span adds nothing to its job")

	want := reqSpan.SpanContext().TraceID()
	require.Eventually(t, func() bool {
		var work, round bool
		for _, s := range exporter.GetSpans() {
			for _, l := range s.Links {
				if l.SpanContext.TraceID() == want {
					work = work || s.Name == "river.work"
					round = round || s.Name == "events.fanout"
				}
			}
		}
		return work && round
	}, 30*time.Second, 10*time.Millisecond, "no river.work and events.fanout spans linked to the recording span")
}
