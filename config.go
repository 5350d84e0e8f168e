package events

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/standmeet/events/internal/listener"
	"github.com/standmeet/events/internal/startstop"
	"github.com/standmeet/events/internal/statements"
)

// Defaults of [RelayConfig], [AwaiterConfig] and [ListenerConfig], applied to
// fields left zero.
const (
	BatchSizeDefault         = 200
	MaxAttemptsDefault       = 5
	RetryBackoffDefault      = 2 * time.Second
	MaxRetryBackoffDefault   = time.Minute
	PollIntervalDefault      = time.Second
	NotFoundGraceDefault     = 2 * time.Second
	MaxRoundsInFlightDefault = 2
	OrphanAfterDefault       = 15 * time.Minute
)

// The listening connection's own timing (see [ListenerConfig]), private
// as River's notifier keeps its own: a lost connection is re-established
// after reconnectBackoffDefault, doubling up to maxReconnectBackoffDefault;
// one silent for pingIntervalDefault is pinged, and silence past twice that
// ends it, as does a dial that has not connected and listened by then.
const (
	reconnectBackoffDefault    = 250 * time.Millisecond
	maxReconnectBackoffDefault = 2 * time.Second
	pingIntervalDefault        = 5 * time.Second // River's
)

// ListenerConfig configures how a [Relay] and an [Awaiter] learn of changes:
// a dedicated listening connection each, and polling. The zero value works.
//
// The listening connection looks after itself, as River's notifier does: one
// silent for 5 s is pinged, and one whose answer does not come within as
// long is ended ([Relay.Health] then reports the relay as not listening), so
// a peer that vanished without closing it (a failover, a proxy or NAT that
// stopped forwarding) is noticed; a lost connection is re-established after
// 250 ms, doubling up to 2 s, so a failover ends within 2 s of the new
// primary accepting connections.
type ListenerConfig struct {
	// PollInterval is how often an idle relay looks for pending events
	// without a notification (watch triggers send none, notifications are
	// throttled, and lost while a listener reconnects; after activity a
	// relay looks sooner, for about a second; one query answers both this
	// and the retry schedule), and how often a PollOnly awaiter re-reads the
	// events it waits for (one query for all waiters). It bounds how long an
	// event can wait when no notification comes: a lone watched-table write
	// on an idle system waits up to this long. Defaults to
	// PollIntervalDefault (1 s).
	PollInterval time.Duration

	// PollOnly opens no listening connection: the relay and the awaiter
	// learn of changes by polling every PollInterval only. For a pool behind
	// a transaction-pooling proxy (PgBouncer in transaction mode), where
	// LISTEN receives nothing, when Connect cannot reach the server
	// directly.
	PollOnly bool

	// Connect opens the listening connection. Defaults to connecting with
	// the pool's own configuration. Behind a transaction-pooling proxy, give
	// a function that connects to PostgreSQL directly, so LISTEN works while
	// every other query goes through the proxy (pgxlisten's Connect is the
	// same idea). The connection is closed when it is lost or the relay or
	// awaiter stops.
	Connect func(ctx context.Context) (*pgx.Conn, error)

	// hooks let tests in this package change the listening connection's
	// timing.
	hooks listenerHooks
}

// listenerHooks let tests in this package change the listening
// connection's timing; a zero field means the default.
type listenerHooks struct {
	reconnectBackoff, maxReconnectBackoff, pingInterval time.Duration
}

func (c ListenerConfig) withDefaults() ListenerConfig {
	c.PollInterval = cmp.Or(c.PollInterval, PollIntervalDefault)
	c.hooks.reconnectBackoff = cmp.Or(c.hooks.reconnectBackoff, reconnectBackoffDefault)
	c.hooks.maxReconnectBackoff = cmp.Or(c.hooks.maxReconnectBackoff, maxReconnectBackoffDefault)
	c.hooks.pingInterval = cmp.Or(c.hooks.pingInterval, pingIntervalDefault)
	return c
}

func (c ListenerConfig) validate() error {
	if c.PollInterval < 0 {
		return invalidf(ErrInvalidConfig, "Listener.PollInterval", "%v: must not be negative", c.PollInterval)
	}
	return nil
}

// listen starts, as a goroutine of run, the listening connection that c
// describes for a service reading through pool: l holds the service's part
// (its channels, application name, callbacks and test pause), listen the
// rest. It returns l, whose Listening reports on the connection; with
// PollOnly it starts nothing and returns nil.
func (c ListenerConfig) listen(run *startstop.Run, pool *pgxpool.Pool, logger *slog.Logger, l *listener.Listener) *listener.Listener {
	if c.PollOnly {
		return nil
	}
	l.ConnConfig = pool.Config().ConnConfig
	l.Connect = c.Connect
	l.PingInterval = c.hooks.pingInterval
	l.ReconnectMin, l.ReconnectMax = c.hooks.reconnectBackoff, c.hooks.maxReconnectBackoff
	l.Logger = logger
	run.Go(l.Run)
	return l
}

// statementsFor returns the statements of schema, or a [*ValidationError]
// for a bad schema name.
func statementsFor(schema string) (*statements.Set, error) {
	s, err := statements.For(schema)
	if err != nil {
		return nil, invalidf(ErrInvalidConfig, "Outbox.Schema", "%q: %v", schema, err)
	}
	return s, nil
}
