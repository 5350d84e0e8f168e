package webhook

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
)

// Disable commits the endpoint's disabling, then cancels its pending
// deliveries in batches. An Enable, and a new event's delivery, can land in
// between (or between two batches, with thousands pending; likewise after
// an automatic disable, whose cancelling runs after its transaction):
// Disable's cancelling must not take the delivery made after the Enable,
// which nothing will ever send again.
func TestDisableDoesNotCancelDeliveriesMadeAfterTheEnable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	b.stop() // no worker: the delivery stays pending, as it would be for a moment
	ep, err := b.wh.Create(ctx, EndpointParams{URL: "http://127.0.0.1:1/", Types: []string{"**"}})
	require.NoError(t, err)

	// Disable, as far as its first statement…
	require.NoError(t, b.wh.exec(ctx, "UPDATE webhook_endpoints SET enabled = false, disabled_reason = 'x', disabled_at = now() WHERE id = $1", ep.ID))
	// …an Enable and a new delivery meanwhile…
	require.NoError(t, b.wh.Enable(ctx, ep.ID))
	e := b.record(t, events.Event{Type: "a"})[0]
	_, err = b.client.Insert(ctx, deliverArgs(ep.ID, e, ""), b.wh.deliverOpts())
	require.NoError(t, err)
	// …then the rest of Disable.
	_, err = b.wh.cancelPending(ctx, ep.ID)
	require.NoError(t, err)
	require.Equal(t, "available", b.state(t, e.ID, ep.ID), "the delivery made after the Enable is still to be sent")
}
