package webhook

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
)

// createAsV010 inserts an endpoint the way 0.1.0's Create does, as a 0.1.0
// process still running during the rolling deploy (migrate first, then roll
// out) does after migration 005: no webhook_endpoint_health row.
func createAsV010(t *testing.T, b *bundle, url string) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	_, err := b.pool.Exec(context.Background(), `INSERT INTO webhook_endpoints
		(id, url, description, types, scopes, headers, secrets, timeout_ms, max_in_flight)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		id, url, "", []string{"**"}, []string{}, map[string]string{}, `[{"secret":"`+NewSecret()+`"}]`, 15000, 10)
	require.NoError(t, err)
	return id
}

// An endpoint created by a 0.1.0 process after migration 005, then given a
// rate limit by the new release, still gets its deliveries.
func TestEndpointCreatedByPreviousReleaseTakesARateLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls.Add(1) }))
	defer srv.Close()
	id := createAsV010(t, b, srv.URL)
	_, err := b.wh.Update(ctx, id, EndpointParams{URL: srv.URL, Types: []string{"**"}, RateLimit: 5})
	require.NoError(t, err)
	e := b.record(t, events.Event{Type: "a"})[0]
	require.Eventually(t, func() bool { return b.state(t, e.ID, id) == "completed" }, 15*time.Second, 10*time.Millisecond,
		"delivered, not failed with \"no rows in result set\"")
	require.Equal(t, int32(1), calls.Load())
}

// An endpoint created by a 0.1.0 process after migration 005 has a circuit
// breaker like any other: its consecutive failures count and open it.
func TestEndpointCreatedByPreviousReleaseHasABreaker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{BreakerThreshold: 2, BreakerInterval: time.Hour})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusInternalServerError) }))
	defer srv.Close()
	id := createAsV010(t, b, srv.URL)
	b.record(t, events.Event{Type: "a"}, events.Event{Type: "b"}, events.Event{Type: "c"})
	b.attempts(t, id, 2)
	require.Eventually(t, func() bool {
		h, err := b.wh.Health(ctx, id)
		require.NoError(t, err)
		return h[0].Breaker == BreakerOpen
	}, 10*time.Second, 10*time.Millisecond, "two failures open the breaker")
}
