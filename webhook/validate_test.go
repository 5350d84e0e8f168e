package webhook

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/testdb"
)

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

// A refused config field is an *events.ValidationError naming it, as in
// the root package.
func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	for _, c := range []struct {
		cfg   *Config
		field string
	}{
		{&Config{MaxResponseBytes: -1}, "MaxResponseBytes"},
		{&Config{BreakerInterval: -1}, "BreakerInterval"},
		{&Config{AllowedPorts: []int{443, 0}}, "AllowedPorts[1]"},
		{&Config{Keys: []Key{{ID: "k", Key: []byte("short")}}}, "Keys[0].Key"},
		{&Config{Keys: []Key{{ID: "bad id", Key: make([]byte, 32)}}}, "Keys[0].ID"},
		{&Config{Outbox: events.Outbox{Schema: "a-b"}}, "Outbox.Schema"},
	} {
		_, err := New(pool, c.cfg)
		var ve *events.ValidationError
		require.ErrorAs(t, err, &ve, c.field)
		require.ErrorIs(t, err, events.ErrInvalidConfig, c.field)
		require.Equal(t, c.field, ve.Field)
	}
	_, err := New(nil, nil)
	require.ErrorIs(t, err, events.ErrInvalidConfig)
}
