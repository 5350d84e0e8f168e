package webhook

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
)

// A network failure's error is net/http's *url.Error, which names the whole
// URL, query included, where tokens live (the disabled event leaves them
// out for that reason): neither the attempt log nor river_job.errors (shown
// by River UI) keeps it.
func TestNetworkErrorNamesNoURLQuery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{BreakerThreshold: 1000})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there now: connection refused
	const token = "tok-3f9a1c77"
	ep, err := b.wh.Create(ctx, EndpointParams{URL: "http://" + addr + "/hooks?token=" + token, Types: []string{"**"}})
	require.NoError(t, err)
	e := b.record(t, events.Event{Type: "a"})[0]
	a := b.attempts(t, ep.ID, 1)[0]
	require.Equal(t, "network", a.ErrorClass)
	require.NotContains(t, a.Error, token)
	require.Eventually(t, func() bool { s := b.state(t, e.ID, ep.ID); return s == "retryable" || s == "available" },
		10*time.Second, 10*time.Millisecond)
	var errs string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT errors::text FROM river_job WHERE kind = 'webhook.deliver'
		AND args->>'endpoint_id' = $1`, ep.ID.String()).Scan(&errs))
	require.NotContains(t, errs, token)
}
