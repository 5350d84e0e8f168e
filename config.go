package events

import (
	"cmp"
	"log/slog"
	"os"
	"time"

	"github.com/standmeet/events/internal/statements"
)

// Defaults of [Config], [AwaiterConfig] and [ListenerConfig], applied to
// fields left zero.
const (
	BatchSizeDefault           = 200
	MaxAttemptsDefault         = 5
	RetryBackoffDefault        = 2 * time.Second
	MaxRetryBackoffDefault     = time.Minute
	ReconnectBackoffDefault    = 250 * time.Millisecond
	MaxReconnectBackoffDefault = 10 * time.Second
	NotFoundGraceDefault       = 2 * time.Second
)

// ListenerConfig configures the dedicated listening connection that a
// [Relay] and an [Awaiter] each keep. The zero value works.
type ListenerConfig struct {
	// ReconnectBackoff is the first pause before re-establishing a lost
	// listening connection; it doubles up to MaxReconnectBackoff. Defaults
	// to ReconnectBackoffDefault (250 ms).
	ReconnectBackoff time.Duration

	// MaxReconnectBackoff caps ReconnectBackoff's doubling. Defaults to
	// MaxReconnectBackoffDefault (10 s).
	MaxReconnectBackoff time.Duration
}

func (c ListenerConfig) withDefaults() ListenerConfig {
	c.ReconnectBackoff = cmp.Or(c.ReconnectBackoff, ReconnectBackoffDefault)
	c.MaxReconnectBackoff = cmp.Or(c.MaxReconnectBackoff, MaxReconnectBackoffDefault)
	return c
}

func (c ListenerConfig) validate() error {
	switch {
	case c.ReconnectBackoff < 0:
		return invalidf(ErrInvalidConfig, "Listener.ReconnectBackoff", "%v: must not be negative", c.ReconnectBackoff)
	case c.MaxReconnectBackoff < c.ReconnectBackoff:
		return invalidf(ErrInvalidConfig, "Listener.MaxReconnectBackoff", "%v: must be at least ReconnectBackoff (%v)", c.MaxReconnectBackoff, c.ReconnectBackoff)
	}
	return nil
}

// defaultLogger writes warnings and errors to standard error.
func defaultLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// statementsFor returns the statements of schema, or a [*ValidationError]
// for a bad schema name.
func statementsFor(schema string) (*statements.Set, error) {
	s, err := statements.For(schema)
	if err != nil {
		return nil, invalidf(ErrInvalidConfig, "Schema", "%q: %v", schema, err)
	}
	return s, nil
}
