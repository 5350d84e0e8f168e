package webhook

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

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
