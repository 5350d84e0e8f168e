package events

import (
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// silenceAll makes every connection of p silent, those open now and those
// accepted from now on (a proxy or load balancer that still accepts TCP but
// no longer reaches the server), until heal.
func (p *blackholeProxy) silenceAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.silence[p.gen])
	p.gen++
	p.silence[p.gen] = make(chan struct{})
	close(p.silence[p.gen]) // new connections are silent from their first byte
}

// heal forwards the connections accepted from now on again.
func (p *blackholeProxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gen++
	p.silence[p.gen] = make(chan struct{})
}

// Silence bounds the dial too: a listener that dials again while the path
// still blackholes (TCP accepted, nothing answered) must give that attempt
// up like a silent session, or it waits in the startup handshake forever
// and never listens again, even after the path is back. The listener's
// connect has no deadline (a URL without connect_timeout gives pgx none).
func TestAListenerThatDialsIntoTheSilenceListensAgainAfterIt(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	u, err := url.Parse(b.url)
	require.NoError(t, err)
	proxy := newBlackholeProxy(t, u.Host)
	const ping = 300 * time.Millisecond
	b.relay.config.Listener.Connect = proxy.connectVia(t, b.url, "relay_via_proxy")
	b.relay.config.Listener.PingInterval = ping
	b.start(t)
	b.settle(t)
	require.True(t, b.relay.Health().Listening)

	proxy.silenceAll()
	require.Eventually(t, func() bool { return !b.relay.Health().Listening }, 2*ping+time.Second, time.Millisecond,
		"the silent session is noticed")
	// The first connection, pgconn's cancel request for the ping that
	// timed out (it closes the connection that way), then the listener's
	// new dial, into the silence.
	require.Eventually(t, func() bool {
		proxy.mu.Lock()
		defer proxy.mu.Unlock()
		return len(proxy.conns) >= 2*3 // accepted, and given its generation
	}, 5*time.Second, time.Millisecond,
		"the listener dials again during the outage")
	proxy.heal()
	healedAt := time.Now()
	// The dial in the silence gives up within the silence bound, and the
	// next one, after at most MaxReconnectBackoff, goes through.
	bound := 2*ping + MaxReconnectBackoffDefault + time.Second
	require.Eventually(t, func() bool { return b.relay.Health().Listening }, bound, time.Millisecond,
		"the listener never listened again after the path came back")
	t.Logf("listening again %v after the path came back; %d connections accepted", time.Since(healedAt), proxy.accepted.Load())
}
