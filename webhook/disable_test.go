package webhook

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
)

// The disabled event is recorded in each of the endpoint's scopes, so the
// tenant's own endpoints hear it, and carries the endpoint's ID and host but
// never its URL's path or query.
func TestDisabledEventCarriesScopesNotURL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	var mu sync.Mutex
	bodies := map[string][]string{} // path -> bodies received
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/dying" {
			w.WriteHeader(http.StatusGone)
			return
		}
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies[r.URL.Path] = append(bodies[r.URL.Path], string(body))
		mu.Unlock()
	}))
	defer srv.Close()
	dying, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL + "/dying?token=s3cr3t", Types: []string{"order.*"},
		Scopes: []string{"tenant:1", "tenant:2"}})
	require.NoError(t, err)
	tenant2, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL + "/tenant2", Types: []string{"webhook.**"}, Scopes: []string{"tenant:2"}})
	require.NoError(t, err)
	all, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL + "/all", Types: []string{"webhook.**"}})
	require.NoError(t, err)
	b.record(t, events.Event{Type: "order.placed", Scope: "tenant:1"})

	b.attempts(t, tenant2.ID, 1)
	b.attempts(t, all.ID, 2)
	rows, err := b.pool.Query(ctx, "SELECT scope, payload FROM outbox_events WHERE type = $1 ORDER BY scope", EventEndpointDisabled)
	require.NoError(t, err)
	type row struct {
		Scope   string
		Payload []byte
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	require.Len(t, got, 2, "one per scope")
	u, _ := url.Parse(srv.URL)
	for i, scope := range []string{"tenant:1", "tenant:2"} {
		require.Equal(t, scope, got[i].Scope)
		var p map[string]any
		require.NoError(t, json.Unmarshal(got[i].Payload, &p))
		require.Equal(t, dying.ID.String(), p["endpoint_id"])
		require.Equal(t, u.Host, p["host"])
		require.ElementsMatch(t, []any{"tenant:1", "tenant:2"}, p["scopes"])
		require.NotContains(t, string(got[i].Payload), "s3cr3t")
		require.NotContains(t, string(got[i].Payload), "/dying")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, bodies["/tenant2"], 1, "the tenant's own endpoint hears its scope's event")
	for _, body := range append(bodies["/all"], bodies["/tenant2"]...) {
		require.True(t, strings.Contains(body, dying.ID.String()))
		require.NotContains(t, body, "s3cr3t")
	}
}

var _ = time.Second

// Disable cancels the deliveries pending for the endpoint: a retry waiting
// at disable time is not sent after a quick re-enable, and neither is one
// that was running during the disable.
func TestDisableCancelsPendingDeliveries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	var mu sync.Mutex
	calls := map[string]int{}
	hold := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(HeaderID)
		mu.Lock()
		calls[id]++
		n := calls[id]
		mu.Unlock()
		if r.URL.Path == "/held" && n == 1 {
			<-hold
		}
		if n == 1 {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	count := func(id uuid.UUID) int { mu.Lock(); defer mu.Unlock(); return calls[id.String()] }

	// A retry pending at disable time.
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"a"}})
	require.NoError(t, err)
	e := b.record(t, events.Event{Type: "a"})[0]
	b.attempts(t, ep.ID, 1)
	require.Eventually(t, func() bool { s := b.state(t, e.ID, ep.ID); return s == "retryable" || s == "available" }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, b.wh.Disable(ctx, ep.ID, "maintenance"))
	require.Equal(t, "cancelled", b.state(t, e.ID, ep.ID), "Disable cancels what is pending")
	require.NoError(t, b.wh.Enable(ctx, ep.ID))
	later := b.record(t, events.Event{Type: "a"})[0]
	require.Eventually(t, func() bool { return count(later.ID) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, "cancelled", b.state(t, e.ID, ep.ID))
	require.Equal(t, 1, count(e.ID))

	// A delivery running during the disable: its retry is not sent either.
	held, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL + "/held", Types: []string{"b"}})
	require.NoError(t, err)
	e = b.record(t, events.Event{Type: "b"})[0]
	require.Eventually(t, func() bool { return count(e.ID) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, b.wh.Disable(ctx, held.ID, "maintenance"))
	require.NoError(t, b.wh.Enable(ctx, held.ID))
	close(hold)
	b.attempts(t, held.ID, 1)
	require.Eventually(t, func() bool {
		id, s, _, _ := b.job(t, e.ID, held.ID)
		if s == "retryable" || s == "available" { // the clock moves on: due now
			_, err := b.pool.Exec(ctx, "UPDATE river_job SET scheduled_at = now() WHERE id = $1 AND state IN ('retryable', 'available')", id)
			require.NoError(t, err)
		}
		return s == "cancelled"
	}, 15*time.Second, 20*time.Millisecond)
	require.Equal(t, 1, count(e.ID))
}
