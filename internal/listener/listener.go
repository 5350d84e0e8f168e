// Package listener keeps one dedicated connection LISTENing on a set of
// channels, and re-establishes it, with capped backoff, whenever it is lost.
//
// A connection that only listens can die without an error: a peer that
// vanished (a failover, a dropped NAT entry, a proxy that stops forwarding)
// sends no FIN and no RST, and a read waits forever. So the listener pings
// the server whenever the connection has been silent for PingInterval and
// gives the answer PingInterval to come (River's notifier pings every 5 s),
// and turns on TCP keepalives; silence past that bound ends the session, and
// a new one is dialled, itself given up if it has not connected within the
// same bound.
package listener

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/standmeet/events/internal/backoff"
)

// Application names tag listening connections in pg_stat_activity, so an
// operator (or a test) can find them.
const (
	ApplicationName        = "standmeet_events_listener" // a relay's
	AwaiterApplicationName = "standmeet_events_awaiter"  // an Awaiter's
)

// Listener is configured by its fields and run by Run.
type Listener struct {
	// ConnConfig is copied for every connection attempt, unless Connect is
	// set.
	ConnConfig *pgx.ConnConfig
	// Connect, when set, opens the connection instead.
	Connect  func(ctx context.Context) (*pgx.Conn, error)
	Channels []string
	// ApplicationName is set on the connection; defaults to ApplicationName.
	ApplicationName string

	// OnNotify is called, on the Run goroutine, for every notification.
	OnNotify func(channel, payload string)
	// OnConnect is called after every successful connect, once LISTEN is
	// in effect, with whether an earlier session of this Listener had
	// connected: notifications sent while disconnected are lost, so callers
	// re-check state here.
	OnConnect func(reconnect bool)

	// PingInterval is how long the connection may stay silent before it is
	// pinged, and how long the ping may take. Defaults to PingIntervalDefault.
	PingInterval time.Duration

	Logger *slog.Logger
	// ReconnectMin and ReconnectMax bound the pause between attempts.
	ReconnectMin, ReconnectMax time.Duration
	// Sleep waits d or until ctx ends. Defaults to backoff.Sleep; tests
	// replace it.
	Sleep func(ctx context.Context, d time.Duration)

	listening atomic.Bool // LISTEN is in effect
	connected atomic.Bool // a session has connected
}

// Listening reports whether LISTEN is in effect: a session has connected
// and has not ended.
func (l *Listener) Listening() bool { return l.listening.Load() }

// PingIntervalDefault is Listener.PingInterval's default, River's.
const PingIntervalDefault = 5 * time.Second

// Run listens until ctx ends. It never returns early: connection failures are
// logged and retried.
func (l *Listener) Run(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		err := l.session(ctx, &failures)
		if ctx.Err() != nil {
			return
		}
		failures++
		d := backoff.Delay(failures, l.ReconnectMin, l.ReconnectMax)
		l.Logger.WarnContext(ctx, "events: listener connection lost; reconnecting",
			slog.String("err", err.Error()), slog.Duration("in", d), slog.Int("failures", failures))
		if l.Sleep != nil {
			l.Sleep(ctx, d)
		} else {
			_ = backoff.Sleep(ctx, d)
		}
	}
}

// session connects, listens and relays notifications until the connection or
// ctx fails, or the server stops answering pings.
func (l *Listener) session(ctx context.Context, failures *int) error {
	ping := l.PingInterval
	if ping <= 0 {
		ping = PingIntervalDefault
	}
	conn, err := l.open(ctx, ping)
	if err != nil {
		return err
	}
	defer closeConn(ctx, conn) // the session is over either way
	*failures = 0
	l.listening.Store(true)
	reconnect := l.connected.Swap(true)
	if l.OnConnect != nil {
		l.OnConnect(reconnect)
	}
	defer l.listening.Store(false)
	return l.relay(ctx, conn, ping)
}

// open connects and LISTENs on the channels. The dial is bounded like a
// silent session (twice ping): a path that accepts TCP and answers nothing
// (a proxy that lost the server) would otherwise hold the startup handshake
// forever; each LISTEN is bounded by ping.
func (l *Listener) open(ctx context.Context, ping time.Duration) (*pgx.Conn, error) {
	dialCtx, cancelDial := context.WithTimeout(ctx, 2*ping)
	conn, err := l.connect(dialCtx)
	cancelDial()
	if err != nil {
		return nil, err
	}
	keepAlive(conn.PgConn().Conn())
	for _, ch := range l.Channels {
		listenCtx, cancel := context.WithTimeout(ctx, ping)
		_, err := conn.Exec(listenCtx, "LISTEN "+pgx.Identifier{ch}.Sanitize())
		cancel()
		if err != nil {
			closeConn(ctx, conn)
			return nil, err
		}
	}
	return conn, nil
}

// relay hands every notification to OnNotify until the connection or ctx
// fails, or a ping after a silent interval goes unanswered within ping.
func (l *Listener) relay(ctx context.Context, conn *pgx.Conn, ping time.Duration) error {
	for {
		waitCtx, cancel := context.WithTimeout(ctx, ping)
		n, err := conn.WaitForNotification(waitCtx)
		cancel()
		switch {
		case err == nil:
			l.OnNotify(n.Channel, n.Payload)
		case ctx.Err() != nil:
			return ctx.Err()
		case pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded):
			// Silent for a whole interval: is anyone there?
			pingCtx, cancel := context.WithTimeout(ctx, ping)
			err := conn.Ping(pingCtx)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("no answer to a ping within %v: %w", ping, err)
			}
		default:
			return err
		}
	}
}

// closeConn closes conn within a second, even once ctx has ended.
func closeConn(ctx context.Context, conn *pgx.Conn) {
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = conn.Close(closeCtx)
}

// keepAlive turns on TCP keepalives that notice a dead peer within about
// 30 s, as a second line behind the pings, when c is a TCP connection
// (possibly under TLS).
func keepAlive(c net.Conn) {
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn()
	}
	if tcp, ok := c.(*net.TCPConn); ok {
		_ = tcp.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3})
	}
}

func (l *Listener) connect(ctx context.Context) (*pgx.Conn, error) {
	if l.Connect != nil {
		return l.Connect(ctx)
	}
	cfg := l.ConnConfig.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = ApplicationName
	if l.ApplicationName != "" {
		cfg.RuntimeParams["application_name"] = l.ApplicationName
	}
	return pgx.ConnectConfig(ctx, cfg)
}
