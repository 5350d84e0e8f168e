package webhook

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
)

// busyForever answers every request with 503 and Retry-After: 1, and counts
// them.
func busyForever(calls *atomic.Int32) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
}

// An endpoint that answers 503 + Retry-After: 1 forever is disabled after
// AutoDisableAfter, like any failing endpoint: the snooze counts.
func TestRetryAfterCountsTowardAutoDisable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{AutoDisableAfter: 2 * time.Second})
	var calls atomic.Int32
	srv := busyForever(&calls)
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}})
	require.NoError(t, err)
	e := b.record(t, events.Event{Type: "a"})[0]
	require.Eventually(t, func() bool {
		got, err := b.wh.Get(ctx, ep.ID)
		require.NoError(t, err)
		return !got.Enabled
	}, 20*time.Second, 20*time.Millisecond, "disabled after 2 s of 503s")
	require.Eventually(t, func() bool { return b.state(t, e.ID, ep.ID) == "cancelled" }, 10*time.Second, 10*time.Millisecond)
	require.LessOrEqual(t, calls.Load(), int32(6), "about one request a second for two seconds")
}

// Retry-After answers are tries like any other: after MaxAttempts of them the
// delivery is given up, and the log numbers them 1…MaxAttempts.
func TestRetryAfterCountsTowardGivingUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{BreakerThreshold: 1000}) // the breaker would hold it after 5
	var calls atomic.Int32
	srv := busyForever(&calls)
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}})
	require.NoError(t, err)
	e := b.record(t, events.Event{Type: "a"})[0]
	require.Eventually(t, func() bool { return b.state(t, e.ID, ep.ID) == "cancelled" }, 30*time.Second, 20*time.Millisecond,
		"given up after %d tries", MaxAttempts)
	require.Equal(t, int32(MaxAttempts), calls.Load())
	a := b.attempts(t, ep.ID, MaxAttempts)
	require.Len(t, a, MaxAttempts)
	for i := range a {
		require.Equal(t, i+1, a[i].Attempt)
	}
	got, err := b.wh.Get(ctx, ep.ID)
	require.NoError(t, err)
	require.True(t, got.Enabled, "one given-up delivery does not disable the endpoint")
}

// A delivery is given up after GiveUpAfter, however few tries it had.
func TestGiveUpAfterBoundsTotalTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{GiveUpAfter: 2 * time.Second})
	var calls atomic.Int32
	srv := busyForever(&calls)
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}})
	require.NoError(t, err)
	e := b.record(t, events.Event{Type: "a"})[0]
	require.Eventually(t, func() bool { return b.state(t, e.ID, ep.ID) == "cancelled" }, 20*time.Second, 20*time.Millisecond)
	require.Less(t, calls.Load(), int32(MaxAttempts))
	require.GreaterOrEqual(t, calls.Load(), int32(1))
}

// state is the state of the newest delivery job of an event to an endpoint,
// "" while there is none.
func (b *bundle) state(t *testing.T, event, endpoint uuid.UUID) string {
	t.Helper()
	var state string
	err := b.pool.QueryRow(context.Background(), `SELECT state FROM river_job WHERE kind = 'webhook.deliver'
		AND args->>'event_id' = $1 AND args->>'endpoint_id' = $2 ORDER BY id DESC LIMIT 1`, event.String(), endpoint.String()).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	require.NoError(t, err)
	return state
}
