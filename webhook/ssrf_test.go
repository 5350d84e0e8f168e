package webhook

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/testdb"
)

// The ranges the first guard missed: NAT64 local use, 6to4, IPv4-compatible,
// site-local, Teredo. Checked with the address check alone: no packet is sent.
func TestGuardRefusesTransitionAndLegacyRanges(t *testing.T) {
	for _, ip := range []string{
		"64:ff9b:1::a00:1",    // NAT64 local use (RFC 8215)
		"64:ff9b:1:ffff::1",   //
		"2002:7f00:1::1",      // 6to4 of 127.0.0.1
		"2002:5db8:d822::1",   // 6to4 of a public address: the relay is not ours to trust either
		"::7f00:1",            // IPv4-compatible 127.0.0.1
		"::a9fe:a9fe",         // IPv4-compatible 169.254.169.254
		"::5db8:d822",         // IPv4-compatible, deprecated whatever it embeds
		"fec0::1",             // site-local
		"feff::1",             //
		"2001:0:4136:e378::1", // Teredo
		"2001:0:ffff:ffff::1", //
		"2001:2::1",           // benchmarking
	} {
		require.ErrorIs(t, CheckAddress(netip.MustParseAddr(ip)), ErrForbiddenAddress, ip)
	}
	for _, ip := range []string{"2001:4860:4860::8888", "2a00:1450:4001:82b::200e", "2606:4700::1111", "64:ff9b::5db8:d822"} {
		require.NoError(t, CheckAddress(netip.MustParseAddr(ip)), ip)
	}
}

// Port policy: port 0 never; with Config.AllowedPorts, only those, at
// registration and at dial time.
func TestPortPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	wh, err := New(testdb.New(t), &Config{AllowedPorts: []int{443, 8443}, PlainSecrets: true})
	require.NoError(t, err)
	for _, u := range []string{"https://example.com/", "https://example.com:8443/", "http://example.com:443/"} {
		_, err := wh.Create(ctx, EndpointParams{URL: u, Types: []string{"**"}})
		require.NoError(t, err, u)
	}
	for _, u := range []string{"http://example.com/", "https://example.com:8080/", "https://example.com:0/"} {
		_, err := wh.Create(ctx, EndpointParams{URL: u, Types: []string{"**"}})
		require.ErrorIs(t, err, ErrInvalidEndpoint, u)
		require.ErrorIs(t, err, ErrForbiddenAddress, u)
	}
	_, err = New(testdb.New(t), &Config{AllowedPorts: []int{0}})
	require.Error(t, err)

	// At dial time: the endpoint was registered under a wider policy.
	b := setup(t, nil)
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls.Add(1) }))
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}})
	require.NoError(t, err)
	u, _ := url.Parse(srv.URL)
	port, _ := strconv.Atoi(u.Port())
	b.wh.guard.ports = []int{port + 1}
	b.record(t, events.Event{Type: "a"})
	a := b.attempts(t, ep.ID, 1)[0]
	require.Equal(t, "forbidden_address", a.ErrorClass, a.Error)
	require.Zero(t, calls.Load())
}

// IPv4-translated addresses (::ffff:0:a.b.c.d, RFC 2765's SIIT) are an
// IPv6 transition form a translator turns into the IPv4 address inside,
// where the guard cannot see: refused like ::/96, 2002::/16 and the rest.
func TestGuardRefusesIPv4Translated(t *testing.T) {
	for _, s := range []string{"::ffff:0:7f00:1", "::ffff:0:a9fe:a9fe", "::ffff:0:a00:1", "::ffff:0:5db8:d822"} {
		require.ErrorIs(t, CheckAddress(netip.MustParseAddr(s)), ErrForbiddenAddress, s)
		_, err := guard{}.validateURL("http://[" + s + "]/")
		require.ErrorIs(t, err, ErrForbiddenAddress, s)
	}
}

// A URL spelled as a number that got into the table (written before this
// check existed) is refused at dial time, without asking the resolver,
// which would read 127.1 as 127.0.0.1.
func TestNumericHostIsNotResolved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil) // loopback allowed: only the spelling is refused
	var calls, lookups atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls.Add(1) }))
	defer srv.Close()
	b.wh.lookup = func(context.Context, string) ([]netip.Addr, error) {
		lookups.Add(1) // what the system resolver would answer
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}})
	require.NoError(t, err)
	u, _ := url.Parse(srv.URL)
	_, err = b.pool.Exec(ctx, "UPDATE webhook_endpoints SET url = $2 WHERE id = $1", ep.ID,
		"http://"+strings.Replace(u.Host, "127.0.0.1", "127.1", 1)+"/")
	require.NoError(t, err)
	b.record(t, events.Event{Type: "a"})
	a := b.attempts(t, ep.ID, 1)[0]
	require.Equal(t, "forbidden_address", a.ErrorClass, a.Error)
	require.Zero(t, lookups.Load(), "never handed to the resolver")
	require.Zero(t, calls.Load())
}
