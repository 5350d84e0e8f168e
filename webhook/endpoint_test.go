package webhook

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/testdb"
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

// What Get, List and Update return prints no secret, however a host logs
// it: the unexported copy of the row an Endpoint carries held the secrets
// stored in clear (Config.PlainSecrets, rows from 0.1.0 not yet re-sealed),
// and %+v, %#v and slog's text handler print unexported fields.
func TestReturnedEndpointPrintsNoSecret(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{PlainSecrets: true})
	const header = "Bearer hunter2-header"
	ep, err := b.wh.Create(ctx, EndpointParams{URL: "http://127.0.0.1:1/", Types: []string{"**"},
		SecretHeaders: map[string]string{"Authorization": header}})
	require.NoError(t, err)
	secret := ep.Secrets[0].Secret
	got, err := b.wh.Get(ctx, ep.ID)
	require.NoError(t, err)
	list, err := b.wh.List(ctx, [16]byte{}, 10)
	require.NoError(t, err)
	updated, err := b.wh.Update(ctx, ep.ID, EndpointParams{URL: "http://127.0.0.1:2/", Types: []string{"**"}})
	require.NoError(t, err)
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("endpoint", "got", got)
	for name, e := range map[string]Endpoint{"Get": got, "List": list.Endpoints[0], "Update": updated} {
		for _, s := range []string{fmt.Sprintf("%v", e), fmt.Sprintf("%+v", e), fmt.Sprintf("%#v", e), logged.String()} {
			require.NotContains(t, s, secret, "%s", name)
			require.NotContains(t, s, header, "%s", name)
		}
	}
}

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
	require.Eventually(t, func() bool { s := b.state(t, e.ID, ep.ID); return s == "retryable" || s == "available" }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, b.wh.Disable(ctx, ep.ID, "maintenance"))
	require.Equal(t, "cancelled", b.state(t, e.ID, ep.ID), "Disable cancels what is pending")
	require.NoError(t, b.wh.Enable(ctx, ep.ID))
	later := b.record(t, events.Event{Type: "a"})[0]
	require.Eventually(t, func() bool { return count(later.ID) == 1 }, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, "cancelled", b.state(t, e.ID, ep.ID))
	require.Equal(t, 1, count(e.ID))

	// A delivery running during the disable: its retry is not sent either.
	held, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL + "/held", Types: []string{"b"}})
	require.NoError(t, err)
	e = b.record(t, events.Event{Type: "b"})[0]
	require.Eventually(t, func() bool { return count(e.ID) == 1 }, 30*time.Second, 10*time.Millisecond)
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

// Registration refuses what can never work or must never be dialled, with
// errors that match the documented sentinels. No request is made.
func TestRegistrationRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	wh, err := New(testdb.New(t), &Config{AllowedNetworks: []netip.Prefix{}, PlainSecrets: true})
	require.NoError(t, err)
	for _, c := range []struct {
		url       string
		headers   map[string]string
		forbidden bool // also ErrForbiddenAddress
	}{
		// Non-canonical spellings of IPv4 addresses, which the system resolver
		// would take as numbers.
		{url: "http://127.1/", forbidden: true},
		{url: "http://2130706433/", forbidden: true},
		{url: "http://0x7f000001/", forbidden: true},
		{url: "http://0177.0.0.1/", forbidden: true},
		{url: "http://0x7f.1/", forbidden: true},
		{url: "http://10.1/", forbidden: true},
		{url: "http://127.0.0.1./", forbidden: true},
		{url: "http://1.2.3.4.5/"},
		{url: "http://example.123/"},
		{url: "http://8.8.8.010/"}, // octal: 8.8.8.8 to the resolver, not what it reads like
		// Private and loopback literals.
		{url: "http://127.0.0.1/", forbidden: true},
		{url: "http://10.1.2.3:8080/", forbidden: true},
		{url: "http://[::1]/", forbidden: true},
		{url: "http://[fe80::1%25eth0]/"},
		// Ports.
		{url: "http://example.com:99999/"},
		{url: "http://example.com:65536/"},
		{url: "http://example.com:0/"},
		// Headers.
		{url: "https://example.com/", headers: map[string]string{"X Tenant": "1"}},
		{url: "https://example.com/", headers: map[string]string{"X-Tenant:": "1"}},
		{url: "https://example.com/", headers: map[string]string{"": "1"}},
		{url: "https://example.com/", headers: map[string]string{"X-Tenant": "1\r\nX-Injected: 1"}},
		{url: "https://example.com/", headers: map[string]string{"X-Tenant": "1\n"}},
		{url: "https://example.com/", headers: map[string]string{"X-Tenant": "a\x00b"}},
		{url: "https://example.com/", headers: map[string]string{"X-Tenant": "a", "x-tenant": "b"}},
		{url: "https://example.com/", headers: map[string]string{"Ünicode": "1"}},
	} {
		name := fmt.Sprintf("%s %q", c.url, c.headers)
		_, err := wh.Create(ctx, EndpointParams{URL: c.url, Types: []string{"**"}, Headers: c.headers})
		require.ErrorIs(t, err, ErrInvalidEndpoint, name)
		var ve *events.ValidationError
		require.ErrorAs(t, err, &ve, "one error type across packages: %s", name)
		require.NotEmpty(t, ve.Field, name)
		if c.forbidden {
			require.ErrorIs(t, err, ErrForbiddenAddress, name)
		}
	}
	for _, u := range []string{"https://example.com:443/", "https://example.com:8443/x?y=1", "http://93.184.216.34/",
		"http://[2606:2800:220:1:248:1893:25c8:1946]:8080/", "https://a1.example/", "https://123abc.example/"} {
		_, err := wh.Create(ctx, EndpointParams{URL: u, Types: []string{"**"},
			Headers: map[string]string{"Authorization": "Bearer x", "X-Odd_Token!": "tab\tok"}})
		require.NoError(t, err, u)
	}
}
