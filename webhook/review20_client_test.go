package webhook

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/testdb"
)

// Replay and Recover insert deliveries through the client they are given;
// like Relay.Start they refuse a River client of another schema than the
// Outbox's (its jobs would land where no worker of this outbox looks), and a
// nil one, instead of inserting the job elsewhere or panicking.
func TestReplayRefusesAClientOfAnotherSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	billing := events.Outbox{Schema: "billing"}
	require.NoError(t, billing.Migrate(ctx, pool))
	wh, err := New(pool, &Config{Outbox: billing, Keys: []Key{testKey("k")}, AllowedNetworks: loopback})
	require.NoError(t, err)
	ep, err := wh.Create(ctx, EndpointParams{URL: "http://127.0.0.1:1/hooks", Types: []string{"**"}})
	require.NoError(t, err)
	var e events.Event
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		e, err = billing.Record(ctx, tx, events.Event{Type: "order.placed"})
		return err
	}))
	searchPath, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	require.NoError(t, err)

	err = wh.Replay(ctx, searchPath, e.ID, ep.ID)
	var ve *events.ValidationError
	require.ErrorAs(t, err, &ve)
	require.ErrorIs(t, err, events.ErrInvalidConfig)
	require.Equal(t, "client", ve.Field)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM public.river_job").Scan(&n))
	require.Zero(t, n, "a delivery job inserted in the search_path's schema")
	_, err = wh.Recover(ctx, searchPath, ep.ID, e.CreatedAt.Add(-1), e.CreatedAt.Add(1))
	require.ErrorIs(t, err, events.ErrInvalidConfig)

	require.ErrorIs(t, wh.Replay(ctx, nil, e.ID, ep.ID), events.ErrInvalidConfig, "a nil client")

	// The client of the Outbox's schema inserts the delivery there.
	inBilling, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: "billing"})
	require.NoError(t, err)
	require.NoError(t, wh.Replay(ctx, inBilling, e.ID, ep.ID))
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM billing.river_job WHERE kind = 'webhook.deliver'").Scan(&n))
	require.Equal(t, 1, n)
}
