package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"syscall"
	"time"
)

// ErrForbiddenAddress is returned for a URL, or an address it resolves to,
// that deliveries may not reach: loopback, private, link-local (cloud
// metadata services live there), CGNAT, multicast, unspecified and similar
// ranges, in IPv4 and IPv6, and IPv4 addresses embedded in IPv6
// (IPv4-mapped, NAT64). Config.AllowedNetworks lifts it for chosen ranges.
var ErrForbiddenAddress = errors.New("webhook: address not allowed")

// forbidden are the ranges a delivery may never reach by default.
var forbidden = func() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range []string{
		"0.0.0.0/8",       // "this network", unspecified
		"10.0.0.0/8",      // private
		"100.64.0.0/10",   // CGNAT
		"127.0.0.0/8",     // loopback
		"169.254.0.0/16",  // link-local, cloud metadata (169.254.169.254)
		"172.16.0.0/12",   // private
		"192.0.0.0/24",    // IETF protocol assignments
		"192.0.2.0/24",    // documentation
		"192.168.0.0/16",  // private
		"198.18.0.0/15",   // benchmarking
		"198.51.100.0/24", // documentation
		"203.0.113.0/24",  // documentation
		"224.0.0.0/4",     // multicast
		"240.0.0.0/4",     // reserved, broadcast
		"::/128",          // unspecified
		"::1/128",         // loopback
		"fc00::/7",        // unique local
		"fe80::/10",       // link-local
		"ff00::/8",        // multicast
		"2001:db8::/32",   // documentation
		"100::/64",        // discard
	} {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}()

// nat64 is the well-known NAT64 prefix: its last 32 bits are an IPv4
// address.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// guard decides which addresses deliveries may reach.
type guard struct {
	allowed []netip.Prefix
}

// check returns ErrForbiddenAddress for an address in a forbidden range
// (looking through IPv4-mapped and NAT64 forms) that no allowed prefix
// covers.
func (g guard) check(ip netip.Addr) error {
	ip = ip.WithZone("")
	for _, p := range g.allowed {
		if p.Contains(ip) || (ip.Is4In6() && p.Contains(ip.Unmap())) {
			return nil
		}
	}
	candidates := []netip.Addr{ip, ip.Unmap()}
	if nat64.Contains(ip) {
		b := ip.As16()
		candidates = append(candidates, netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}))
	}
	for _, c := range candidates {
		for _, p := range forbidden {
			if p.Contains(c) {
				return fmt.Errorf("%w: %s is in %s", ErrForbiddenAddress, ip, p)
			}
		}
	}
	return nil
}

// validateURL checks an endpoint URL at registration: http or https, a
// host, no user info, and not an IP literal the guard refuses. A host name
// is checked when a delivery resolves it.
func (g guard) validateURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return nil, fmt.Errorf("webhook: URL %q: %w", raw, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("webhook: URL %q: the scheme must be http or https", raw)
	case u.User != nil:
		return nil, fmt.Errorf("webhook: URL %q: no user info (use Headers for credentials)", raw)
	case u.Hostname() == "":
		return nil, fmt.Errorf("webhook: URL %q: no host", raw)
	}
	if ip, err := netip.ParseAddr(u.Hostname()); err == nil {
		if err := g.check(ip); err != nil {
			return nil, fmt.Errorf("webhook: URL %q: %w", raw, err)
		}
	}
	return u, nil
}

// lookupFunc resolves a host name; tests give their own.
type lookupFunc func(ctx context.Context, host string) ([]netip.Addr, error)

// newClient returns the HTTP client of deliveries: it resolves the host
// itself, refuses every forbidden address, and dials the address it
// checked (so a DNS answer that changes between check and dial cannot slip
// through); the dialer's Control checks once more, on the socket's own
// address. No proxy, no redirects (a 3xx is a failure), no keep-alive
// surprises across endpoints beyond the transport's pool.
func (g guard) newClient(lookup lookupFunc, dialed func(ctx context.Context, ip string)) *http.Client {
	dialer := &net.Dialer{
		Timeout: 10 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("%w: %s", ErrForbiddenAddress, address)
			}
			return g.check(ap.Addr())
		},
	}
	transport := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(address)
			if err != nil {
				return nil, err
			}
			var ips []netip.Addr
			if ip, err := netip.ParseAddr(host); err == nil {
				ips = []netip.Addr{ip}
			} else if ips, err = lookup(ctx, host); err != nil {
				return nil, err
			}
			lastErr := fmt.Errorf("webhook: %s resolves to no address", host)
			for _, ip := range ips {
				if err := g.check(ip); err != nil {
					lastErr = err
					continue
				}
				conn, err := dialer.DialContext(ctx, network, net.JoinHostPort(ip.String(), port))
				if err != nil {
					lastErr = err
					continue
				}
				if dialed != nil {
					dialed(ctx, ip.String())
				}
				return conn, nil
			}
			return nil, lastErr
		},
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 0, // the request's own timeout bounds it
	}
	return &http.Client{
		Transport:     transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// defaultLookup resolves with the system's resolver.
func defaultLookup(ctx context.Context, host string) ([]netip.Addr, error) {
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	return addrs, nil
}

// CheckAddress reports whether a delivery may reach ip: nil, or an error
// wrapping ErrForbiddenAddress. allowed lifts the ban for chosen ranges,
// like Config.AllowedNetworks. Deliveries run this check on every address
// they dial; it is exported for hosts that validate addresses of their own.
func CheckAddress(ip netip.Addr, allowed ...netip.Prefix) error {
	return guard{allowed: allowed}.check(ip)
}
