package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrForbiddenAddress is returned for a URL, or an address it resolves to,
// that deliveries may not reach: loopback, private, link-local (cloud
// metadata services live there), CGNAT, multicast, unspecified and similar
// ranges, in IPv4 and IPv6; IPv4 addresses embedded in IPv6 (IPv4-mapped,
// NAT64 well-known); the IPv6 transition and legacy ranges whose traffic a
// relay or translator forwards somewhere the guard cannot see (6to4
// 2002::/16, Teredo 2001::/32, NAT64 local use 64:ff9b:1::/48,
// IPv4-compatible ::/96, IPv4-translated ::ffff:0:0:0/96, site-local
// fec0::/10); port 0, and ports outside
// Config.AllowedPorts when it is set. Config.AllowedNetworks lifts it for
// chosen ranges.
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
		"::/96",           // IPv4-compatible (deprecated): ::a.b.c.d
		"::ffff:0:0:0/96", // IPv4-translated (SIIT, RFC 2765): a translator dials the IPv4 address inside
		"64:ff9b:1::/48",  // NAT64 for local use (RFC 8215): translators of the operator's choosing
		"2002::/16",       // 6to4: a relay dials the IPv4 address inside
		"2001::/32",       // Teredo: likewise
		"2001:2::/48",     // benchmarking
		"fec0::/10",       // site-local (deprecated, still routed inside some sites)
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
	// ports, when set, are the only ports deliveries may reach.
	ports []int
}

// checkPort refuses port 0 (the kernel would pick one) and, with an
// allowlist, any port not on it.
func (g guard) checkPort(port int) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("%w: port %d", ErrForbiddenAddress, port)
	}
	if len(g.ports) > 0 && !slices.Contains(g.ports, port) {
		return fmt.Errorf("%w: port %d is not in Config.AllowedPorts", ErrForbiddenAddress, port)
	}
	return nil
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
// host, no user info, a port from 1 to 65535, no IPv4 address spelled other
// than as four decimal numbers, and no IP literal the guard refuses. A host
// name is checked when a delivery resolves it.
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
	port := map[string]int{"http": 80, "https": 443}[u.Scheme]
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n > 65535 {
			return nil, fmt.Errorf("webhook: URL %q: port %s is not between 1 and 65535", raw, p)
		}
		port = n
	}
	if err := g.checkPort(port); err != nil {
		return nil, fmt.Errorf("webhook: URL %q: %w", raw, err)
	}
	host := u.Hostname()
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return nil, fmt.Errorf("webhook: URL %q: an IPv6 zone names an interface of this machine", raw)
		}
		if err := g.check(ip); err != nil {
			return nil, fmt.Errorf("webhook: URL %q: %w", raw, err)
		}
		return u, nil
	}
	if ip, numeric := numericHost(host); numeric {
		err := fmt.Errorf("webhook: URL %q: host %q is a number, not a name; write an IPv4 address as four decimal numbers", raw, host)
		if ip.IsValid() {
			err = fmt.Errorf("webhook: URL %q: host %q is a non-canonical spelling of %s; write that instead", raw, host, ip)
			if ferr := g.check(ip); ferr != nil {
				return nil, fmt.Errorf("%w: %w", err, ferr)
			}
		}
		return nil, err
	}
	return u, nil
}

// numericHost reports whether host, which netip does not parse, would be
// read as a number by a resolver or a browser: its last label (a trailing
// dot aside) is a decimal, octal or hexadecimal number, as in 127.1,
// 2130706433, 0x7f000001, 0177.0.0.1 or 127.0.0.1. (WHATWG URL calls this
// "ends in a number"). When the host is a valid inet_aton spelling, ip is
// the address it means.
func numericHost(host string) (ip netip.Addr, numeric bool) {
	trimmed := strings.TrimSuffix(host, ".")
	labels := strings.Split(trimmed, ".")
	if _, ok := parseInetNumber(labels[len(labels)-1]); !ok {
		return netip.Addr{}, false
	}
	if len(labels) > 4 {
		return netip.Addr{}, true
	}
	var parts []uint64
	for _, l := range labels {
		n, ok := parseInetNumber(l)
		if !ok {
			return netip.Addr{}, true
		}
		parts = append(parts, n)
	}
	// inet_aton: a.b.c.d, a.b.c (c fills 16 bits), a.b (b fills 24), a (32).
	var v uint64
	for i, n := range parts[:len(parts)-1] {
		if n > 255 {
			return netip.Addr{}, true
		}
		v |= n << (8 * (3 - i))
	}
	last := parts[len(parts)-1]
	if last >= 1<<(8*(5-len(parts))) {
		return netip.Addr{}, true
	}
	v |= last
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

// parseInetNumber reads one label the way inet_aton does: 0x… hexadecimal,
// 0… octal, otherwise decimal.
func parseInetNumber(s string) (uint64, bool) {
	base := 10
	switch {
	case len(s) >= 2 && (s[:2] == "0x" || s[:2] == "0X"):
		s, base = s[2:], 16
		if s == "" {
			return 0, true // "0x" alone is 0 to inet_aton
		}
	case len(s) > 1 && s[0] == '0':
		s, base = s[1:], 8
	}
	if s == "" {
		return 0, false
	}
	n, err := strconv.ParseUint(s, base, 32)
	return n, err == nil
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
	transport := &http.Transport{
		Proxy:                 nil,
		DialContext:           g.dialContext(lookup, dialed),
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

// dialContext returns the transport's dial: it checks the port, resolves
// the host itself, and dials the first of its addresses that the guard
// allows, reporting it to dialed (when set). The dialer checks the address
// once more as it dials.
func (g guard) dialContext(lookup lookupFunc, dialed func(ctx context.Context, ip string)) func(ctx context.Context, network, address string) (net.Conn, error) {
	dialer := &net.Dialer{Timeout: 10 * time.Second, Control: g.control}
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(address)
		if err != nil {
			return nil, err
		}
		if n, err := strconv.Atoi(port); err != nil {
			return nil, fmt.Errorf("%w: port %q", ErrForbiddenAddress, port)
		} else if err := g.checkPort(n); err != nil {
			return nil, err
		}
		ips, err := resolve(ctx, lookup, host)
		if err != nil {
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
	}
}

// resolve returns host's addresses: host itself if it is one, else what
// lookup finds. A host that a resolver would read as a number is refused.
func resolve(ctx context.Context, lookup lookupFunc, host string) ([]netip.Addr, error) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{ip}, nil
	}
	if _, numeric := numericHost(host); numeric {
		// A resolver would read it as an address, whatever the guard thinks
		// of that address: never hand it one.
		return nil, fmt.Errorf("%w: host %q is a number, not a name", ErrForbiddenAddress, host)
	}
	return lookup(ctx, host)
}

// control is the dialer's check of the address it is about to dial.
func (g guard) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrForbiddenAddress, address)
	}
	if err := g.checkPort(int(ap.Port())); err != nil {
		return err
	}
	return g.check(ap.Addr())
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
