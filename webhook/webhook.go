// Package webhook sends events out of the service as signed HTTP
// deliveries, the part every user of an outbox ends up writing by hand.
//
//	wh, err := webhook.New(pool, &webhook.Config{Keys: []webhook.Key{{ID: "2026-12", Key: key32}}})
//	relay.Subscribe(wh.Subscriber("webhooks"))
//	wh.AddWorkers(workers)
//	ep, err := wh.Create(ctx, webhook.EndpointParams{URL: "https://example.com/hooks", Types: []string{"order.**"}})
//
// The relay gives every event to one River job of kind "webhook.fanout",
// which inserts, in one transaction, one "webhook.deliver" job per enabled
// endpoint whose type globs and scopes match (unique per event and
// endpoint, so a retried fanout never doubles a delivery). Each delivery
// carries what it needs (type, time, payload), so it does not depend on the
// outbox row, which retention may delete.
//
// A delivery follows Standard Webhooks v1: headers webhook-id (the event ID,
// the receiver's idempotency key), webhook-timestamp and webhook-signature
// (v1,<base64 HMAC-SHA256 of "id.timestamp.body">, one per active secret);
// body {"type", "timestamp", "data"}. Success is a 2xx; redirects are not
// followed; 410 Gone disables the endpoint; 429, 502, 503 and 504 with
// Retry-After snooze the job; other failures retry after about 5 s, 5 min,
// 30 min, 2 h, 5 h, 10 h and 10 h (±20 %), then the delivery is given up.
// Every attempt is logged. An endpoint that has failed every attempt for
// Config.AutoDisableAfter is disabled, and a "webhook.endpoint.disabled"
// event is recorded through the outbox.
//
// Deliveries dial only public addresses: the host is resolved by the
// library, every address is checked (loopback, private, link-local and
// cloud metadata, CGNAT, multicast, unspecified, their IPv6 and embedded
// IPv4 forms are refused) and the checked address is the one dialled, so DNS
// rebinding cannot slip through; no proxy. Config.AllowedNetworks opens
// chosen ranges (tests, deliberate internal receivers).
//
// Signing secrets, and header values given as EndpointParams.SecretHeaders,
// are sealed at rest with AES-256-GCM under the host's Config.Keys (each
// value names the key that sealed it, so keys rotate: see [Webhooks.Reseal]);
// Get and List return them [Redacted], and the fanout never reads them.
// Without keys the library refuses to store a secret unless
// Config.PlainSecrets says to keep it in clear.
//
// Each endpoint has a circuit breaker and an optional rate limit, both kept
// in PostgreSQL so that every process obeys them: after
// Config.BreakerThreshold consecutive failures its deliveries wait, and one
// probe per Config.BreakerInterval tries it until one succeeds;
// EndpointParams.RateLimit caps its requests per second. Waiting is never
// counted as a try. [Webhooks.Health] reports success rate, latency and the
// breaker's state over the last hour.
//
// Receivers in Go check deliveries with [Handler] (verification, replay
// refusal, the delivery's ID for idempotency) or [Verify].
package webhook

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/logging"
	"github.com/standmeet/events/internal/statements"
)

// Defaults of Config and EndpointParams.
const (
	TimeoutDefault          = 15 * time.Second
	MaxInFlightDefault      = 10
	MaxResponseBytesDefault = 20 << 10
	AutoDisableAfterDefault = 5 * 24 * time.Hour
	SecretGraceDefault      = 24 * time.Hour
	AttemptRetentionDefault = 30 * 24 * time.Hour
	// GiveUpAfterDefault bounds a delivery's life: the retry schedule spans
	// about 28 h (33 h at the top of its jitter); the rest is room for
	// Retry-After pauses and deliveries held by the circuit breaker.
	GiveUpAfterDefault = 3 * 24 * time.Hour
	// MaxAttempts is how many times a delivery is tried before it is given
	// up: the first try and seven retries. Every request counts, whether it
	// failed, timed out or was answered with Retry-After.
	MaxAttempts = 8
)

// EventEndpointDisabled is the type of the event recorded when an endpoint
// is disabled automatically (failing for AutoDisableAfter, or 410 Gone). It
// is recorded once in each of the endpoint's scopes (once unscoped for an
// endpoint without scopes), with a [DisabledEvent] as its payload.
const EventEndpointDisabled = "webhook.endpoint.disabled"

// DisabledEvent is the payload of an EventEndpointDisabled event. It names
// the endpoint by ID and host: the URL's path and query, where tokens live,
// never leave the endpoint's row.
type DisabledEvent struct {
	EndpointID uuid.UUID `json:"endpoint_id"`
	// Host is the URL's host and port.
	Host   string   `json:"host"`
	Scopes []string `json:"scopes"`
	Reason string   `json:"reason"`
}

// Config configures the webhooks. The zero value works.
type Config struct {
	// Outbox is the schema of the tables (the library's, River's and the
	// webhooks'), as every component is built from it. The zero Outbox is
	// the search_path's.
	Outbox events.Outbox
	// MaxResponseBytes is how much of a response body is read and kept in
	// the attempt log. Defaults to MaxResponseBytesDefault (20 KB).
	MaxResponseBytes int
	// AutoDisableAfter disables an endpoint that has failed every attempt
	// for this long. Defaults to AutoDisableAfterDefault (5 days).
	AutoDisableAfter time.Duration
	// GiveUpAfter is how long after its creation a delivery is given up,
	// however few of its MaxAttempts tries it had (Retry-After pauses and
	// an open circuit breaker hold a delivery without trying it). Defaults
	// to GiveUpAfterDefault (3 days).
	GiveUpAfter time.Duration
	// AttemptRetention is how long the attempt log is kept (see
	// PeriodicJobs). Defaults to AttemptRetentionDefault (30 days).
	AttemptRetention time.Duration
	// AllowedNetworks are ranges deliveries may reach although the guard
	// forbids them (loopback for tests, a deliberate internal receiver).
	AllowedNetworks []netip.Prefix
	// AllowedPorts, when set, are the only ports endpoint URLs may name and
	// deliveries may dial (say 443 only). Empty allows every port from 1 to
	// 65535: receivers listen where they like, and what the guard protects
	// is the address, not the port. Port 0 is always refused.
	AllowedPorts []int
	// BreakerThreshold is how many consecutive failed requests open an
	// endpoint's circuit breaker: its deliveries then wait, and one probe
	// per BreakerInterval tries it, until one succeeds. Defaults to
	// BreakerThresholdDefault (5).
	BreakerThreshold int
	// BreakerInterval is how long an open breaker waits before a probe.
	// Defaults to BreakerIntervalDefault (30 s).
	BreakerInterval time.Duration
	// Keys seal endpoint secrets and secret header values at rest, with
	// AES-256-GCM: the first seals, every one opens what it sealed (each
	// value names its key's ID). To rotate, add the new key (deploy it to
	// every process), put it first, run Reseal (the periodic job does it
	// hourly), then drop the old key. Without keys, secrets are not stored
	// (ErrNoKeys) unless PlainSecrets is set.
	Keys []Key
	// PlainSecrets lets the library store secrets in clear when Keys is
	// empty: whoever reads the table (a backup, a replica, a support
	// dump) can then sign deliveries. With Keys set it changes nothing.
	PlainSecrets bool
	// Queue is the River queue of the fanout and delivery jobs. Defaults to
	// river.QueueDefault.
	Queue string
	// Logger receives the package's logs. Defaults to warnings and errors on
	// standard error, as every component of the library.
	Logger *slog.Logger
}

// Webhooks is the package's entry point: endpoints, the subscriber, the
// workers.
type Webhooks struct {
	pool   *pgxpool.Pool
	config Config
	guard  guard
	lookup lookupFunc
	outbox events.Outbox
	sql    *statements.Webhook
	keys   keyring

	clientOnce sync.Once
	client     *http.Client // deliveries', made on first use

	mu       sync.Mutex
	inFlight map[uuid.UUID]int
}

// New returns the webhooks of pool's database. Outbox.Migrate creates their
// tables.
func New(pool *pgxpool.Pool, config *Config) (*Webhooks, error) {
	if pool == nil {
		return nil, invalidConfig("pool", "is nil")
	}
	if config == nil {
		config = &Config{}
	}
	cfg := *config
	cfg.MaxResponseBytes = cmp.Or(cfg.MaxResponseBytes, MaxResponseBytesDefault)
	cfg.AutoDisableAfter = cmp.Or(cfg.AutoDisableAfter, AutoDisableAfterDefault)
	cfg.AttemptRetention = cmp.Or(cfg.AttemptRetention, AttemptRetentionDefault)
	cfg.GiveUpAfter = cmp.Or(cfg.GiveUpAfter, GiveUpAfterDefault)
	cfg.BreakerThreshold = cmp.Or(cfg.BreakerThreshold, BreakerThresholdDefault)
	cfg.BreakerInterval = cmp.Or(cfg.BreakerInterval, BreakerIntervalDefault)
	cfg.Queue = cmp.Or(cfg.Queue, river.QueueDefault)
	cfg.Logger = cmp.Or(cfg.Logger, logging.Default())
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	keys, err := newKeyring(cfg.Keys, cfg.PlainSecrets)
	if err != nil {
		return nil, err
	}
	cfg.Keys = nil // the keyring holds them; a copy of Config should not
	sql, err := statements.For(cfg.Outbox.Schema)
	if err != nil { // validate has refused a bad schema already
		return nil, invalidConfig("Outbox.Schema", "%q: %v", cfg.Outbox.Schema, err)
	}
	return &Webhooks{pool: pool, config: cfg, keys: keys, guard: guard{allowed: cfg.AllowedNetworks, ports: cfg.AllowedPorts}, lookup: defaultLookup,
		outbox: cfg.Outbox, sql: &sql.Webhook, inFlight: map[uuid.UUID]int{}}, nil
}

// validate refuses a config that cannot work, with an
// [*events.ValidationError] naming the field.
func (c *Config) validate() error {
	if err := c.Outbox.Validate(); err != nil {
		return err
	}
	for _, f := range []struct {
		name     string
		negative bool
		value    any
	}{
		{"MaxResponseBytes", c.MaxResponseBytes < 0, c.MaxResponseBytes},
		{"AutoDisableAfter", c.AutoDisableAfter < 0, c.AutoDisableAfter},
		{"AttemptRetention", c.AttemptRetention < 0, c.AttemptRetention},
		{"GiveUpAfter", c.GiveUpAfter < 0, c.GiveUpAfter},
		{"BreakerThreshold", c.BreakerThreshold < 0, c.BreakerThreshold},
		{"BreakerInterval", c.BreakerInterval < 0, c.BreakerInterval},
	} {
		if f.negative {
			return invalidConfig(f.name, "%v: must not be negative", f.value)
		}
	}
	for i, p := range c.AllowedPorts {
		if p < 1 || p > 65535 {
			return invalidConfig(fmt.Sprintf("AllowedPorts[%d]", i), "%d: must be between 1 and 65535", p)
		}
	}
	return nil
}

// invalidConfig is a refused Config field, as the root package reports one.
func invalidConfig(field, format string, args ...any) error {
	return &events.ValidationError{Kind: events.ErrInvalidConfig, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// FanoutArgs are the args of a "webhook.fanout" job: the whole event.
type FanoutArgs struct {
	Event events.Event `json:"event"`
}

// Kind is "webhook.fanout".
func (FanoutArgs) Kind() string { return "webhook.fanout" }

// DeliverArgs are the args of a "webhook.deliver" job: one event to one
// endpoint, with everything the delivery needs.
type DeliverArgs struct {
	EndpointID uuid.UUID       `json:"endpoint_id" river:"unique"`
	EventID    uuid.UUID       `json:"event_id" river:"unique"`
	Type       string          `json:"type"`
	Timestamp  time.Time       `json:"timestamp"`
	Data       json.RawMessage `json:"data"`
	// Replay tells a replay apart from the first delivery, which stays
	// unique per event and endpoint.
	Replay string `json:"replay,omitempty" river:"unique"`
}

// Kind is "webhook.deliver".
func (DeliverArgs) Kind() string { return "webhook.deliver" }

// Subscriber returns the relay subscriber that hands every event to a
// "webhook.fanout" job. Register it with relay.Subscribe.
func (w *Webhooks) Subscriber(name string) events.Subscriber {
	return events.Subscriber{Name: name, Types: []string{"**"},
		Map: func(_ context.Context, e events.Event) (river.JobArgs, *river.InsertOpts, error) {
			return FanoutArgs{Event: e}, &river.InsertOpts{Queue: w.config.Queue}, nil
		}}
}

// AddWorkers registers the fanout, delivery and attempt-log workers.
func (w *Webhooks) AddWorkers(workers *river.Workers) error {
	for _, add := range []func() error{
		func() error { return river.AddWorkerSafely(workers, &fanoutWorker{w: w}) },
		func() error { return river.AddWorkerSafely(workers, &deliverWorker{w: w}) },
		func() error { return river.AddWorkerSafely(workers, &pruneWorker{w: w}) },
		func() error { return river.AddWorkerSafely(workers, &resealWorker{w: w}) },
	} {
		if err := add(); err != nil {
			return fmt.Errorf("webhook: add workers: %w", err)
		}
	}
	return nil
}

// PeriodicJobs returns the jobs that delete attempt-log entries older than
// Config.AttemptRetention, every hour, and that run Reseal, at start and
// every hour. Add them to river.Config.PeriodicJobs.
func (w *Webhooks) PeriodicJobs() []*river.PeriodicJob {
	return []*river.PeriodicJob{
		river.NewPeriodicJob(river.PeriodicInterval(time.Hour), func() (river.JobArgs, *river.InsertOpts) {
			return PruneArgs{}, &river.InsertOpts{Queue: w.config.Queue, MaxAttempts: 1}
		}, &river.PeriodicJobOpts{ID: "webhook.prune_attempts"}),
		river.NewPeriodicJob(river.PeriodicInterval(time.Hour), func() (river.JobArgs, *river.InsertOpts) {
			return ResealArgs{}, &river.InsertOpts{Queue: w.config.Queue, MaxAttempts: 3}
		}, &river.PeriodicJobOpts{ID: "webhook.reseal", RunOnStart: true}),
	}
}
