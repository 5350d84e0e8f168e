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
	BatchSizeDefault           = 200
	MaxAttemptsDefault         = 5
	RetryBackoffDefault        = 2 * time.Second
	MaxRetryBackoffDefault     = time.Minute
	ReconnectBackoffDefault    = 250 * time.Millisecond
	MaxReconnectBackoffDefault = 2 * time.Second
	PollIntervalDefault        = time.Second
	NotFoundGraceDefault       = 2 * time.Second
	MaxRoundsInFlightDefault   = 2
	PingIntervalDefault        = 5 * time.Second
	OrphanAfterDefault         = 15 * time.Minute
)

// ListenerConfig configures how a [Relay] and an [Awaiter] learn of changes:
// a dedicated listening connection each, and polling. The zero value works.
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

	// ReconnectBackoff is the first pause before re-establishing a lost
	// listening connection; it doubles up to MaxReconnectBackoff. Defaults
	// to ReconnectBackoffDefault (250 ms).
	ReconnectBackoff time.Duration

	// MaxReconnectBackoff caps ReconnectBackoff's doubling. Defaults to
	// MaxReconnectBackoffDefault (2 s: a failover ends within that of the
	// new primary accepting connections, however long it took).
	MaxReconnectBackoff time.Duration

	// PingInterval is how long the listening connection may stay silent
	// before it is pinged, and how long the answer may take: a connection
	// whose peer vanished without closing it (a failover, a proxy or NAT
	// that stopped forwarding) sends no error, so silence past twice
	// PingInterval ends it and a new one is made, and [Relay.Health] reports
	// it as not listening meanwhile. A dial (with Connect too) that has not
	// connected and listened within twice PingInterval is given up and
	// tried again. TCP keepalives are turned on too.
	// Defaults to PingIntervalDefault (5 s, River's).
	PingInterval time.Duration
}

func (c ListenerConfig) withDefaults() ListenerConfig {
	c.ReconnectBackoff = cmp.Or(c.ReconnectBackoff, ReconnectBackoffDefault)
	c.MaxReconnectBackoff = cmp.Or(c.MaxReconnectBackoff, MaxReconnectBackoffDefault)
	c.PollInterval = cmp.Or(c.PollInterval, PollIntervalDefault)
	c.PingInterval = cmp.Or(c.PingInterval, PingIntervalDefault)
	return c
}

func (c ListenerConfig) validate() error {
	switch {
	case c.ReconnectBackoff < 0:
		return invalidf(ErrInvalidConfig, "Listener.ReconnectBackoff", "%v: must not be negative", c.ReconnectBackoff)
	case c.PollInterval < 0:
		return invalidf(ErrInvalidConfig, "Listener.PollInterval", "%v: must not be negative", c.PollInterval)
	case c.PingInterval < 0:
		return invalidf(ErrInvalidConfig, "Listener.PingInterval", "%v: must not be negative", c.PingInterval)
	case c.MaxReconnectBackoff < c.ReconnectBackoff:
		return invalidf(ErrInvalidConfig, "Listener.MaxReconnectBackoff", "%v: must be at least ReconnectBackoff (%v)", c.MaxReconnectBackoff, c.ReconnectBackoff)
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
	l.PingInterval = c.PingInterval
	l.ReconnectMin, l.ReconnectMax = c.ReconnectBackoff, c.MaxReconnectBackoff
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
