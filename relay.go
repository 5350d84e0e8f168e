package events

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/standmeet/events/internal/backoff"
	"github.com/standmeet/events/internal/engine"
	"github.com/standmeet/events/internal/listener"
	"github.com/standmeet/events/internal/logging"
	"github.com/standmeet/events/internal/startstop"
	"github.com/standmeet/events/internal/statements"
)

// RelayConfig configures a [Relay]. The zero value works; every field
// documents its default.
type RelayConfig struct {
	// Outbox is the schema the relay serves, with the settings every
	// component of it shares. It must name the schema of the River client
	// given to [Relay.Start] (River's tables and the library's live
	// together: see [Outbox.Migrate]). The zero Outbox is the search_path's,
	// as River's zero Schema is.
	Outbox Outbox

	// BatchSize is the most rows one round claims, and so the size of its
	// transaction. Defaults to BatchSizeDefault (200); at most 10,000.
	BatchSize int

	// MaxAttempts is how many times delivering one event to one subscriber
	// may fail (its Map returns an error or panics, or River or PostgreSQL
	// refuses its job) before that delivery is poisoned: set aside for that
	// subscriber alone, never attempted again until [Outbox.Requeue]; the
	// event's other subscribers are not held back. Defaults to
	// MaxAttemptsDefault (5).
	MaxAttempts int

	// RetryBackoff is the pause after the first failure, of a round or of one
	// delivery; it doubles with every further failure, up to MaxRetryBackoff.
	// Defaults to RetryBackoffDefault (2 s).
	RetryBackoff time.Duration

	// MaxRetryBackoff caps RetryBackoff's doubling. Defaults to
	// MaxRetryBackoffDefault (1 min).
	MaxRetryBackoff time.Duration

	// MaxRoundsInFlight is how many rounds the relay may run at once, each
	// in its own transaction, all sharing one listening connection. One
	// round claims, maps, inserts and stamps; while it waits on PostgreSQL
	// another can work, so a busy relay goes faster with two. Extra rounds
	// join only while batches come back full, or while owed deliveries are
	// due and no fresh events flow (while they flow, the first round alone
	// serves a backlog, in short rounds between theirs, so that a fresh
	// event waits for at most one short round of it). Defaults to
	// MaxRoundsInFlightDefault (2, measured: see docs/benchmarks.md).
	MaxRoundsInFlight int

	// Listener configures how the relay learns of new events: its
	// listening connection and its polling.
	Listener ListenerConfig

	// Retention is how long fanned-out events are kept. Older ones are
	// deleted in small batches, by one relay at a time, on a goroutine of the
	// relay that yields while it drains a backlog (see the README's
	// "Retention"). An event that still owes something — a delivery owed or
	// poisoned, for any subscriber, an orphaned one included — is never
	// deleted automatically, nor is an event poisoned as a whole
	// ([Outbox.Discard] gives them up). Defaults to RetentionDefault (7
	// days); a negative value keeps everything.
	Retention time.Duration

	// RetentionInterval is how often a relay runs a retention pass.
	// Defaults to RetentionIntervalDefault (1 min).
	RetentionInterval time.Duration

	// MeterProvider receives the relay's metrics (see the Metric...
	// constants). Nil means none: no global provider is used.
	MeterProvider metric.MeterProvider

	// TracerProvider receives a span per round ("events.fanout", kind
	// producer, linked to the spans that recorded its events). Nil means
	// none.
	TracerProvider trace.TracerProvider

	// OnPoison is called once for every delivery this relay
	// poisons (and every event it poisons as a whole), with the event and
	// the error of its last attempt as the subscriber returned it (it names
	// the subscriber), after the poisoning committed. An error-level log
	// record with the subscriber is written too. Defaults to nil (log only).
	//
	// It runs on a goroutine of its own, one call at a time, never on the
	// relay's loop: a slow OnPoison (paging someone over HTTP) delays only
	// the OnPoison calls after it, and a panic is recovered and logged with
	// the event. Up to 1,000 calls wait in line; beyond that a call is
	// dropped with an error log (the poisoning itself is logged and stored
	// either way). [Relay.Stop] waits for the calls in line within its
	// context, then cancels the context OnPoison was given and returns an
	// error naming the call still running; [Relay.Stopped] is closed once
	// the last call has returned.
	OnPoison func(ctx context.Context, e Event, err error)

	// Logger receives the relay's logs. Defaults to warnings and errors on
	// standard error.
	Logger *slog.Logger
}

func (c *RelayConfig) withDefaults() RelayConfig {
	out := *c
	out.BatchSize = cmp.Or(out.BatchSize, BatchSizeDefault)
	out.MaxAttempts = cmp.Or(out.MaxAttempts, MaxAttemptsDefault)
	out.RetryBackoff = cmp.Or(out.RetryBackoff, RetryBackoffDefault)
	out.MaxRetryBackoff = cmp.Or(out.MaxRetryBackoff, MaxRetryBackoffDefault)
	out.MaxRoundsInFlight = cmp.Or(out.MaxRoundsInFlight, MaxRoundsInFlightDefault)
	out.Retention = cmp.Or(out.Retention, RetentionDefault)
	out.RetentionInterval = cmp.Or(out.RetentionInterval, RetentionIntervalDefault)
	out.Outbox = out.Outbox.withDefaults()
	out.Listener = out.Listener.withDefaults()
	out.Logger = cmp.Or(out.Logger, logging.Default())
	return out
}

func (c *RelayConfig) validate() error {
	if err := c.Outbox.Validate(); err != nil {
		return err
	}
	switch {
	case c.BatchSize < 1 || c.BatchSize > 10_000:
		return invalidf(ErrInvalidConfig, "BatchSize", "%d: must be between 1 and 10000", c.BatchSize)
	case c.MaxAttempts < 1:
		return invalidf(ErrInvalidConfig, "MaxAttempts", "%d: must be at least 1", c.MaxAttempts)
	case c.RetryBackoff < 0:
		return invalidf(ErrInvalidConfig, "RetryBackoff", "%v: must not be negative", c.RetryBackoff)
	case c.MaxRetryBackoff < c.RetryBackoff:
		return invalidf(ErrInvalidConfig, "MaxRetryBackoff", "%v: must be at least RetryBackoff (%v)", c.MaxRetryBackoff, c.RetryBackoff)
	case c.RetentionInterval < 0:
		return invalidf(ErrInvalidConfig, "RetentionInterval", "%v: must not be negative", c.RetentionInterval)
	case c.MaxRoundsInFlight < 1 || c.MaxRoundsInFlight > 16:
		return invalidf(ErrInvalidConfig, "MaxRoundsInFlight", "%d: must be between 1 and 16", c.MaxRoundsInFlight)
	}
	return c.Listener.validate()
}

// Relay turns committed events into River jobs, one per matching subscriber,
// exactly once. Run one in every process that should share the work: relays
// claim rows with FOR UPDATE SKIP LOCKED, so they never fan out a row twice and
// need no leader.
type Relay struct {
	pool    *pgxpool.Pool
	config  RelayConfig
	logger  *slog.Logger
	meter   metric.Meter
	metrics engine.Metrics
	tracer  trace.Tracer
	sql     *statements.Set // the statements of the relay's RelayConfig.Outbox

	// eng is the delivery engine (package engine): the rounds, their loops
	// and the background duties, and their state.
	eng *engine.Relay

	// svc is the relay's lifecycle: its runs, Ready, Stopped and Stop. A
	// run's OnPoison queue is its drain: Stop waits for it only within its
	// context.
	svc startstop.Base

	mu     sync.RWMutex
	subs   []*subscription
	byName map[string]*subscription
	// inTx says a FanoutTx call has borrowed the engine: Start refuses
	// meanwhile, and Stop has no run to stop.
	inTx bool
}

// NewRelay returns a relay that reads events through pool. Register
// subscribers with [Relay.Subscribe] and their workers with
// [Relay.AddWorkers], build the River client, then call [Relay.Start].
// A nil config means the defaults.
func NewRelay(pool *pgxpool.Pool, config *RelayConfig) (*Relay, error) {
	if pool == nil {
		return nil, invalidf(ErrInvalidConfig, "pool", "is nil")
	}
	if config == nil {
		config = &RelayConfig{}
	}
	cfg := config.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	metrics, meter, err := newRelayMetrics(cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("events: relay metrics: %w", err)
	}
	sql, err := statementsFor(cfg.Outbox.Schema)
	if err != nil {
		return nil, err
	}
	r := &Relay{pool: pool, config: cfg, logger: cfg.Logger, sql: sql, byName: map[string]*subscription{},
		svc:     startstop.Base{StopBeforeRestart: true}, // Stop unregisters the gauges
		meter:   meter,
		metrics: metrics, tracer: newTracer(cfg.TracerProvider)}
	r.eng = engine.New(pool, sql, r.engineConfig())
	return r, nil
}

// engineConfig is what the engine takes of the relay's config: set at
// NewRelay, and again as each run or FanoutTx call begins.
func (r *Relay) engineConfig() engine.Config {
	cfg := r.config
	var onPoison func(ctx context.Context, e engine.Event, err error)
	if f := cfg.OnPoison; f != nil {
		onPoison = func(ctx context.Context, e engine.Event, err error) { f(ctx, Event(e), err) }
	}
	return engine.Config{
		BatchSize:         cfg.BatchSize,
		MaxAttempts:       cfg.MaxAttempts,
		RetryBackoff:      cfg.RetryBackoff,
		MaxRetryBackoff:   cfg.MaxRetryBackoff,
		MaxRoundsInFlight: cfg.MaxRoundsInFlight,
		PollInterval:      cfg.Listener.PollInterval,
		PollOnly:          cfg.Listener.PollOnly,
		Retention:         cfg.Retention,
		RetentionInterval: cfg.RetentionInterval,
		OrphanAfter:       cfg.Outbox.OrphanAfter,
		OnPoison:          onPoison,
		Logger:            cfg.Logger,
		Listen: func(run *startstop.Run, l *listener.Listener) *listener.Listener {
			return cfg.Listener.listen(run, r.pool, cfg.Logger, l)
		},
		Metrics: r.metrics,
		Tracer:  r.tracer,
	}
}

// checkSchema refuses a River client of another schema than the relay's:
// its jobs would land where no worker of this outbox looks.
func (r *Relay) checkSchema(client *river.Client[pgx.Tx]) error {
	if schema := client.Schema(); schema != r.config.Outbox.Schema {
		return invalidf(ErrInvalidConfig, "Outbox.Schema", "%q: the River client's schema is %q; name the same schema in both", r.config.Outbox.Schema, schema)
	}
	return nil
}

// Subscribe registers a subscriber. Call it before [Relay.Start]; names are
// unique. The error wraps [ErrInvalidSubscriber] and names the field.
func (r *Relay) Subscribe(s Subscriber) error {
	sub, err := newSubscription(s)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inTx || r.svc.Active() {
		return fmt.Errorf("%w: subscribe %q before Start", ErrStarted, s.Name)
	}
	if _, dup := r.byName[s.Name]; dup {
		return invalidf(ErrInvalidSubscriber, "Name", "%q is already registered", s.Name)
	}
	r.subs = append(r.subs, sub)
	r.byName[s.Name] = sub
	return nil
}

func (r *Relay) subscription(name string) *subscription {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.byName[name]
}

// Start starts the relay: a listener for the outbox's notifications on a
// dedicated connection and the loop that claims and fans out events,
// inserting jobs through client, whose schema must be the relay's [RelayConfig.Outbox].
// Start returns once both are running; the first round starts at once.
//
// Start first registers the relay's subscribers in the database, with their
// type globs (a name not seen before is added; see [Outbox.ListSubscribers]), and
// returns an error if that fails. From then on every event whose
// transaction commits after Start returned reaches every subscriber of this
// relay that it matches, whichever relay fans it out: a relay that lacks one
// of them (another release, during a rolling deploy) writes the delivery as
// owed, and a relay that has it delivers it. A subscriber that was retired
// ([Outbox.RetireSubscriber]) is left out of this run, with a warning. While it
// runs, the relay reports in every few seconds (see [Outbox.ListRelays]).
//
// Cancelling ctx stops the relay abruptly (a round in flight rolls back);
// [Relay.Stop] stops it gracefully, and must be called before the relay can
// be started again either way.
func (r *Relay) Start(ctx context.Context, client *river.Client[pgx.Tx]) error {
	if client == nil {
		return invalidf(ErrInvalidConfig, "client", "is nil")
	}
	err := r.svc.Start(ctx, func(run *startstop.Run) error {
		r.mu.Lock()
		inTx := r.inTx
		r.mu.Unlock()
		if inTx {
			return ErrStarted
		}
		// From here Subscribe and FanoutTx refuse (the service is starting),
		// so prepare's I/O runs without mu: the worker's lookups of
		// subscribers (Handle jobs) take it and must not wait for the
		// registry.
		if err := r.prepare(run.StartContext(), run, client); err != nil {
			return err
		}
		r.eng.Launch(ctx, run)
		return nil
	})
	switch {
	case errors.Is(err, startstop.ErrRunning):
		return ErrStarted
	case errors.Is(err, startstop.ErrLingering):
		return errLastRunLingers
	}
	return err
}

// errLastRunLingers refuses a run, or a FanoutTx call, while an OnPoison
// call of the last run, left running by a Stop that gave up, has not
// returned: the new one would call OnPoison alongside it.
var errLastRunLingers = fmt.Errorf("%w: an OnPoison call of the last run is still running: wait for Stopped", ErrStarted)

// prepare is the part of Start that may fail: the client's schema checked,
// the subscribers registered, the gauges; then the engine's preparation of
// a new run. It runs while the service is starting, without mu.
func (r *Relay) prepare(ctx context.Context, run *startstop.Run, client *river.Client[pgx.Tx]) error {
	if err := r.checkSchema(client); err != nil {
		return err
	}
	active, err := r.register(ctx, r.pool)
	if err != nil {
		return err
	}
	if r.config.MeterProvider != nil {
		gauges, err := r.registerGauges()
		if err != nil {
			return fmt.Errorf("events: relay metrics: %w", err)
		}
		run.OnStop(func() { _ = gauges.Unregister() })
	}
	r.eng.Prepare(ctx, r.engineConfig(), client, active)
	return nil
}

// register registers the relay's subscribers and returns those the run
// serves: all but the retired ones. A lost connection is retried a few
// times: Start should not fail on a blip.
func (r *Relay) register(ctx context.Context, db DB) ([]*engine.Subscription, error) {
	names := make([]string, len(r.subs))
	for i, s := range r.subs {
		names[i] = s.Name
	}
	var (
		retired []string
		err     error
	)
	for attempt := 1; ; attempt++ {
		retired, err = registerSubscribers(ctx, db, r.sql, names, r.subs...)
		if err == nil || attempt == 3 || !engine.IsTransient(err) || ctx.Err() != nil {
			break
		}
		_ = backoff.Sleep(ctx, backoff.Delay(attempt, 100*time.Millisecond, time.Second))
	}
	if err != nil {
		return nil, fmt.Errorf("events: relay: registering subscribers: %w", err)
	}
	active := []*engine.Subscription{}
	for _, s := range r.subs {
		if slices.Contains(retired, s.Name) {
			r.logger.WarnContext(ctx, "events: subscriber was retired; this relay will not fan out to it",
				slog.String("subscriber", s.Name))
			continue
		}
		active = append(active, s.eng)
	}
	return active, nil
}

// Stop stops the relay gracefully: the round in flight commits or rolls back,
// the listener closes, the OnPoison calls in line run, and when Stop returns
// nil no goroutine of the relay is left.
//
// If ctx ends first, the round in flight is cancelled (it rolls back), Stop
// still waits for the loop and the listener (they return promptly once
// cancelled), cancels the context given to OnPoison, and returns an error
// wrapping ctx's error. OnPoison is host code that may ignore its context, so
// Stop does not wait for it past ctx: if a call is still running, the error
// names it ("events: OnPoison still running (event_id=…): context deadline
// exceeded"), and that call, then the rest of the line with the cancelled
// context, is all of the relay that is left. [Relay.Stopped] is closed once
// it has returned; until then Start returns an error wrapping [ErrStarted].
//
// Stop is safe before Start and safe to call twice. A [Relay.FanoutTx] call
// in progress is not a run: Stop leaves it alone.
func (r *Relay) Stop(ctx context.Context) error { return r.svc.Stop(ctx) }

// Ready returns a channel that is closed once the current run of the relay
// listens and has finished a round begun after it started listening: from
// then on it has seen every event committed before, and a notification
// reaches it. Use it as a readiness probe, or in tests. Before the first
// Start it returns a channel that is never closed.
func (r *Relay) Ready() <-chan struct{} { return r.svc.Ready() }

// Stopped returns a channel that is closed once the current run of the relay
// has stopped (by Stop, or because Start's context ended) and its loops, its
// listener and its OnPoison calls have returned: then no goroutine of the run
// is left. Before the first Start it returns a closed channel.
func (r *Relay) Stopped() <-chan struct{} { return r.svc.Stopped() }
