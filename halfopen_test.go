package events

import (
	"context"
	"errors"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// blackholeProxy forwards loopback TCP connections to a PostgreSQL server,
// and on Blackhole makes every connection open at that moment go silent: it
// stops forwarding either way but keeps both sockets open, with no FIN and
// no RST, as a peer that vanished behind a NAT or a failed proxy does.
// Connections made afterwards are forwarded normally.
type blackholeProxy struct {
	ln       net.Listener
	target   string
	accepted atomic.Int32

	mu      sync.Mutex
	gen     int                   // connections of an earlier generation are silenced
	silence map[int]chan struct{} // closed when that generation goes silent
	conns   []net.Conn
	wg      sync.WaitGroup
}

func newBlackholeProxy(t *testing.T, target string) *blackholeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &blackholeProxy{ln: ln, target: target, silence: map[int]chan struct{}{0: make(chan struct{})}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *blackholeProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		silent := p.silence[p.gen]
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		p.wg.Go(func() { pipe(c, up, silent) })
		p.wg.Go(func() { pipe(up, c, silent) })
	}
}

// pipe copies from src to dst until either fails or silent is closed; then it
// holds the sockets open, forwarding nothing.
func pipe(dst, src net.Conn, silent <-chan struct{}) {
	buf := make([]byte, 32<<10)
	for {
		_ = src.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		n, err := src.Read(buf)
		select {
		case <-silent:
			return // what was read is dropped: the wire went dead
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // io.EOF or a reset: the other side closed
		}
	}
}

// Blackhole silences every connection open now.
func (p *blackholeProxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.silence[p.gen])
	p.gen++
	p.silence[p.gen] = make(chan struct{})
}

func (p *blackholeProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// connectVia returns a Listener.Connect that dials the database of dbURL
// through the proxy, with the application name the tests look for.
func (p *blackholeProxy) connectVia(t *testing.T, dbURL, appName string) func(ctx context.Context) (*pgx.Conn, error) {
	_, port, err := net.SplitHostPort(p.ln.Addr().String())
	require.NoError(t, err)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.Host = net.JoinHostPort("127.0.0.1", port)
	cfg, err := pgx.ParseConfig(u.String())
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = appName
	return func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, cfg) }
}

// A listening connection whose peer goes silent (no FIN, no RST) is noticed
// by the ping within two PingIntervals: Health says the relay is not
// listening meanwhile, the relay and the awaiter dial again, and a receipt
// asked for during the outage comes within the bound, not at its deadline.
func TestHalfOpenListeningConnectionsAreNoticed(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	u, err := url.Parse(b.url)
	require.NoError(t, err)
	proxy := newBlackholeProxy(t, u.Host)
	const ping = 300 * time.Millisecond
	b.relay.config.Listener.Connect = proxy.connectVia(t, b.url, "relay_via_proxy")
	b.relay.config.Listener.PingInterval = ping
	a := startAwaiter(t, b, &AwaiterConfig{Listener: ListenerConfig{
		Connect: proxy.connectVia(t, b.url, "awaiter_via_proxy"), PingInterval: ping,
		// Polling far off: the receipt must come from the listener that
		// reconnected, not from the re-read safety net.
		PollInterval: time.Hour,
	}})
	b.relay.config.Listener.PollInterval = time.Hour
	b.start(t)
	b.settle(t)
	requireClosed(t, a.Ready(), "awaiter ready")
	require.EqualValues(t, 2, proxy.accepted.Load(), "the relay's and the awaiter's listening connections")
	require.True(t, b.relay.Health().Listening)

	proxy.Blackhole()
	silencedAt := time.Now()
	bound := 2*ping + time.Second // ping interval + its timeout, and the reconnect

	// The relay notices and says so, then listens again.
	require.Eventually(t, func() bool { return !b.relay.Health().Listening }, bound, time.Millisecond,
		"Health still says listening on a dead connection")
	require.False(t, b.relay.Healthy())
	require.Eventually(t, func() bool { return proxy.accepted.Load() >= 4 && b.relay.Health().Listening }, bound, time.Millisecond,
		"the relay and the awaiter dial again")
	t.Logf("both reconnected %v after the connections went silent", time.Since(silencedAt))
	// Past the relay's re-checks after its reconnect (about a second): the
	// relay polls hourly, so from then on only a notification on its new
	// listening connection (the commit's, or the awaiter's kick) makes it
	// look. (Not settle: the re-checks may be over already.)
	b.rechecksOver(t)

	// A receipt asked for now comes through the new connections.
	e := b.record(t, Event{Type: "after.silence"})[0]
	start := time.Now()
	receipts, err := a.AwaitFanout(within(t, bound), e.ID)
	require.NoError(t, err)
	require.Len(t, receipts, 1)
	t.Logf("receipt after the reconnect in %v", time.Since(start))
}

// The awaiter's re-read bounds a receipt even while its listening connection
// is silently dead and not yet noticed: within PollInterval.
func TestReceiptDuringASilentOutageComesWithinThePollInterval(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
	u, err := url.Parse(b.url)
	require.NoError(t, err)
	proxy := newBlackholeProxy(t, u.Host)
	a := startAwaiter(t, b, &AwaiterConfig{Listener: ListenerConfig{
		Connect: proxy.connectVia(t, b.url, "awaiter_via_proxy"),
		// The ping would take an hour to notice: only the re-read helps.
		PingInterval: time.Hour, PollInterval: 200 * time.Millisecond,
	}})
	b.start(t)
	b.settle(t)
	requireClosed(t, a.Ready(), "awaiter ready")
	proxy.Blackhole()
	e := b.record(t, Event{Type: "during.silence"})[0]
	start := time.Now()
	receipts, err := a.AwaitFanout(within(t, 5*time.Second), e.ID)
	require.NoError(t, err)
	require.Len(t, receipts, 1)
	took := time.Since(start)
	t.Logf("receipt on a dead listening connection in %v", took)
	require.Less(t, took, time.Second)
}
