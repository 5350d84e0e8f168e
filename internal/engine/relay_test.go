package engine

import (
	"context"
	"testing"

	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// A Subscription the engine serves carries its River tags and metric
// labels whether it was built with NewSubscription or as a literal: without
// them its jobs lose "events-subscriber-<name>" and, in a chain,
// "events-ordered" (no worker would complete them in their chain), and a
// real meter panics on the missing labels. Found by review of the engine's
// move.
func TestAServedSubscriptionIsReadyHoweverItWasBuilt(t *testing.T) {
	t.Parallel()
	lit := &Subscription{Name: "ledger", Ordered: true}
	built := NewSubscription(Subscription{Name: "ledger", Ordered: true})

	mp := sdkmetric.NewMeterProvider()
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m := mp.Meter("test")
	var ms Metrics
	ms.Jobs, _ = m.Int64Counter("jobs")
	ms.Fanned, _ = m.Int64Counter("fanned")
	ms.Coalesced, _ = m.Int64Counter("coalesced")
	r := &Relay{config: Config{Metrics: ms}}
	r.serve([]*Subscription{lit})
	require.Equal(t, []string{"ledger"}, r.known)

	for _, chain := range []*chainJob{nil, {head: true}} {
		want := (&plannedJob{mapped: mapped{sub: built, args: testArgs{}}, chain: chain}).insertOpts(nil).Tags
		got := (&plannedJob{mapped: mapped{sub: lit, args: testArgs{}}, chain: chain}).insertOpts(nil).Tags
		require.Equal(t, want, got, "chain=%v", chain != nil)
	}
	jobs := []plannedJob{{mapped: mapped{sub: lit, args: testArgs{}}, covers: []int{0}}}
	require.NotPanics(t, func() {
		r.countFanout(context.Background(), 1, jobs, []*rivertype.JobInsertResult{{Job: &rivertype.JobRow{}}})
	})
}
