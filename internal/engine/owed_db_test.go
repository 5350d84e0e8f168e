package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/engine"
	"github.com/standmeet/events/internal/owedfloor"
	"github.com/standmeet/events/internal/statements"
	"github.com/standmeet/events/internal/testdb"
)

// A claim that meets a pair whose event another session holds (another
// subscriber's round, a Backfill) steps over it and fills its batch from
// the pairs after it, and moves the floor only to what it claimed. Found by
// review: the claim dropped such a pair after its limit and came back
// short, and a short claim moved the floor to the clock less a second, over
// every pair of a backlog due before it, until the next look.
func TestAClaimThatMeetsAHeldEventLeavesTheRestAboveTheFloor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const n, batch = 300, 100
	pool := testdb.New(t)
	register(t, pool, "slow")
	testdb.OweTo(t, pool, "slow", "slow.changed", n)
	exec(t, pool, "UPDATE outbox_deliveries SET next_attempt_at = now() - interval '1 minute'")

	// Another session holds the 50th pair's event, as a Backfill does.
	var seq50 int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT event_seq FROM outbox_deliveries ORDER BY event_seq OFFSET 49 LIMIT 1").Scan(&seq50))
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, "SELECT 1 FROM outbox_events WHERE seq = $1 FOR KEY SHARE", seq50)
	require.NoError(t, err)

	sql, err := statements.For("")
	require.NoError(t, err)
	r := engine.New(pool, sql, config(t))
	floors := &owedfloor.Floors{LookEvery: time.Hour}
	r.SetOwedFloors(floors)
	claim := func() int {
		t.Helper()
		names := []string{"slow"}
		from, _ := floors.Next(names, time.Now())
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { require.NoError(t, tx.Rollback(ctx)) }()
		got, observe, err := r.ClaimOwed(ctx, tx, names, batch, from)
		require.NoError(t, err)
		// As if the round had committed (its pairs served): the floor moves.
		observe()
		return got
	}
	// The claim steps over the held event's pair and fills its batch.
	require.Equal(t, batch, claim(), "the run's first claim (a look) came back short for a held event")
	require.NoError(t, holder.Rollback(ctx))
	require.Equal(t, batch, claim(), "a claim that met a held event moved the floor past the pairs due after it")
}

// register registers subscribers names as a relay's Start does.
func register(t *testing.T, pool *pgxpool.Pool, names ...string) {
	t.Helper()
	ctx := context.Background()
	relay, err := events.NewRelay(pool, nil)
	require.NoError(t, err)
	for _, name := range names {
		require.NoError(t, relay.Subscribe(events.Subscriber{Name: name, Types: []string{"**"},
			Map: func(context.Context, events.Event) (river.JobArgs, *river.InsertOpts, error) { return nil, nil, nil }}))
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	require.NoError(t, err)
	require.NoError(t, relay.Start(ctx, client))
	require.NoError(t, relay.Stop(ctx))
}
