package events

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestConfigAndSubscriberErrorsNameTheField(t *testing.T) {
	t.Parallel()
	_, err := NewRelay(nil, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
	b := setup(t, setupOpts{})
	for cfg, field := range map[*RelayConfig]string{
		{BatchSize: -1}:                              "BatchSize",
		{MaxAttempts: -1}:                            "MaxAttempts",
		{RetryBackoff: -time.Second}:                 "RetryBackoff",
		{RetryBackoff: 2 * time.Minute}:              "MaxRetryBackoff",
		{Listener: ListenerConfig{PollInterval: -1}}: "Listener.PollInterval",
	} {
		_, err = NewRelay(b.pool, cfg)
		var ve *ValidationError
		require.ErrorAs(t, err, &ve)
		require.ErrorIs(t, err, ErrInvalidConfig)
		require.Equal(t, field, ve.Field, "%v", err)
	}
	for cfg, field := range map[*AwaiterConfig]string{
		{NotFoundGrace: -1}:                          "NotFoundGrace",
		{Outbox: Outbox{Schema: "a-b"}}:              "Outbox.Schema",
		{Listener: ListenerConfig{PollInterval: -1}}: "Listener.PollInterval",
	} {
		_, err = NewAwaiter(b.pool, cfg)
		var ve *ValidationError
		require.ErrorAs(t, err, &ve)
		require.Equal(t, field, ve.Field, "%v", err)
	}

	for _, tt := range []struct {
		sub   Subscriber
		field string
	}{
		{Subscriber{Name: "", Types: []string{"a"}, Handle: noopHandle}, "Name"},
		{Subscriber{Name: "Has Space", Types: []string{"a"}, Handle: noopHandle}, "Name"},
		{Subscriber{Name: "x", Handle: noopHandle}, "Types"},
		{Subscriber{Name: "x", Types: []string{"a.b*"}, Handle: noopHandle}, "Types"},
		{Subscriber{Name: "x", Types: []string{"a"}}, "Map/Handle"},
		{Subscriber{Name: "x", Types: []string{"a"}, Handle: noopHandle, Map: mapSub("y", false, "a").Map}, "Map/Handle"},
	} {
		err := b.relay.Subscribe(tt.sub)
		require.ErrorIs(t, err, ErrInvalidSubscriber)
		var ve *ValidationError
		require.ErrorAs(t, err, &ve)
		require.Equal(t, tt.field, ve.Field)
	}
	require.NoError(t, b.relay.Subscribe(Subscriber{Name: "x", Types: []string{"a"}, Handle: noopHandle}))
	require.ErrorIs(t, b.relay.Subscribe(Subscriber{Name: "x", Types: []string{"a"}, Handle: noopHandle}), ErrInvalidSubscriber)
}

// PollOnly: a relay and an awaiter with no listening connection at all (as
// behind a transaction-pooling proxy) still fan out and answer receipts.
func TestPollOnlyRelayAndAwaiter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	poll := ListenerConfig{PollOnly: true, PollInterval: 50 * time.Millisecond}
	b := setup(t, setupOpts{config: &RelayConfig{Listener: poll}}, mapSub("audit", false, "**"))
	b.start(t)
	a := startAwaiter(t, b, &AwaiterConfig{Listener: poll})
	requireClosed(t, b.relay.Ready(), "PollOnly relay ready")
	requireClosed(t, a.Ready(), "PollOnly awaiter ready")
	es := b.record(t, Event{Type: "a"}, Event{Type: "b"})
	receipts, err := a.AwaitFanout(within(t, 30*time.Second), es[0].ID, es[1].ID)
	require.NoError(t, err)
	require.Len(t, receipts[1].Fanout, 1)
	var listeners int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND query LIKE 'LISTEN%'`).Scan(&listeners))
	require.Zero(t, listeners, "PollOnly opens no listening connection")
}

// Listener.Connect opens the listening connection (a direct one, while the
// pool goes through a proxy).
func TestListenerConnectFunc(t *testing.T) {
	t.Parallel()
	var connects atomic.Int32
	b := setup(t, setupOpts{config: &RelayConfig{Listener: ListenerConfig{PollInterval: time.Hour}}}, mapSub("audit", false, "**"))
	b.relay.config.Listener.Connect = func(ctx context.Context) (*pgx.Conn, error) {
		connects.Add(1)
		return pgx.Connect(ctx, b.url)
	}
	b.start(t)
	// Past the re-checks that follow the listener's connect (about a
	// second): from then on only a notification on the connection Connect
	// made can make the relay look (it polls hourly).
	b.quiesce(t)
	require.Equal(t, int32(1), connects.Load())
	var e Event
	require.NoError(t, pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		var err error
		e, err = Outbox{NotifyInterval: NotifyEveryTransaction}.Record(context.Background(), tx, Event{Type: "a"})
		return err
	}))
	fannedWithin(t, b, e.ID, 30*time.Second, "the connection Connect made did not carry the notification")
}

func noopHandle(context.Context, Event) error { return nil }
