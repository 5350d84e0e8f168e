// Package listener keeps one dedicated connection LISTENing on a set of
// channels, and re-establishes it, with capped backoff, whenever it is lost.
package listener

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

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
	// OnConnect is called after every successful (re)connect, once LISTEN is
	// in effect: notifications sent while disconnected are lost, so callers
	// re-check state here.
	OnConnect func()

	Logger *slog.Logger
	// ReconnectMin and ReconnectMax bound the pause between attempts.
	ReconnectMin, ReconnectMax time.Duration
	// Sleep waits d or until ctx ends; tests replace it.
	Sleep func(ctx context.Context, d time.Duration)
}

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
		l.Sleep(ctx, d)
	}
}

// session connects, listens and relays notifications until the connection or
// ctx fails.
func (l *Listener) session(ctx context.Context, failures *int) error {
	conn, err := l.connect(ctx)
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx) // the session is over either way
	}()
	for _, ch := range l.Channels {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return err
		}
	}
	*failures = 0
	if l.OnConnect != nil {
		l.OnConnect()
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		l.OnNotify(n.Channel, n.Payload)
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

// SleepContext waits d or until ctx ends.
func SleepContext(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
