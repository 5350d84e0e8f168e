package events

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/standmeet/events/internal/backoff"
	"github.com/standmeet/events/internal/claimfloor"
	"github.com/standmeet/events/internal/hostcall"
	"github.com/standmeet/events/internal/listener"
	"github.com/standmeet/events/internal/logging"
	"github.com/standmeet/events/internal/maintenance"
	"github.com/standmeet/events/internal/owedfloor"
	"github.com/standmeet/events/internal/startstop"
	"github.com/standmeet/events/internal/statements"
	"github.com/standmeet/events/internal/wake"
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
	// join only while batches come back full, or while owed deliveries are due
	// (they drain a backlog of owed deliveries while fresh events flow, so that
	// no fresh event waits for a round of it). Defaults to
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
	pool   *pgxpool.Pool
	config RelayConfig
	logger *slog.Logger
	hooks  testHooks

	metrics  relayMetrics
	meter    metric.Meter
	tracer   trace.Tracer
	laneAttr [2]metric.MeasurementOption

	// Health, for Health and Healthy.
	lastSuccess atomic.Int64 // unix nanoseconds of the last round or poll that worked
	failing     atomic.Int32 // consecutive failures
	busy        atomic.Bool  // the last pending round came back full
	owedBusy    atomic.Bool  // the last deliveries round claimed pairs: more may be due

	// fresh counts the rows pending rounds claim: whether fresh events
	// flow (freshFlowing).
	fresh freshMeter

	// owedTurn rotates the order in which deliveries rounds serve the
	// subscribers (owedOrder).
	owedTurn atomic.Uint64
	// owedFloors are where the deliveries lane's claims start, per
	// subscriber (package owedfloor): set by launch, for one run.
	owedFloors *owedfloor.Floors

	// claimFloor is where the pending lane's batch claims start (see
	// package claimfloor): set by launch, for one run, before its loops.
	claimFloor *claimfloor.Floor
	// startFloor is where the next run's claims start: the relays' last
	// claim floor, read by prepare (0: from the start).
	startFloor int64

	// svc is the relay's lifecycle: its runs, Ready, Stopped and Stop. A
	// run's OnPoison queue is its drain: Stop waits for it only within its
	// context.
	svc startstop.Base

	sql *statements.Set // the statements of the relay's RelayConfig.Outbox

	mu     sync.RWMutex
	subs   []*subscription
	byName map[string]*subscription
	// inTx says a FanoutTx call has borrowed the run state below: Start
	// refuses meanwhile, and Stop has no run to stop.
	inTx bool

	// Set by Start, for one run, or by FanoutTx, for one call, while it holds
	// mu (and svc is starting, or inTx set). Read without mu only by the
	// run's (or the call's) own goroutines.
	run       *startstop.Run // nil for FanoutTx: never stopping
	client    *river.Client[pgx.Tx]
	active    []*subscription // subs less the retired ones
	known     []string        // names of active
	callbacks *hostcall.Runner
	// listener is the run's listening connection; nil with PollOnly.
	listener atomic.Pointer[listener.Listener]
	// reconnected is sent when the listener (re)connects: the database is
	// back, so the loop ends any backoff at once.
	reconnected wake.Signal
	// floorLookSoon wakes floorLooker for a look below the claim floor
	// that LookSoon made due.
	floorLookSoon wake.Signal
	// serverStart is when the server started, as the main loop's last poll
	// read it (zero: none yet).
	serverStart time.Time
	wake        wake.Signal // the main loop's: notifications
	helpWake    wake.Signal // the helper loops': plenty of work

	// retryCheck asks the loop to read the retry schedule now: this relay
	// has just failed an event.
	retryCheck atomic.Bool

	// convertAt is when the main loop looks for 0.1.0's catch_up lists
	// next.
	convertAt time.Time

	// Heartbeats (heartbeat.go): the run's, and what they report.
	beat      atomic.Pointer[maintenance.Heartbeat]
	lastRound atomic.Int64 // unix nanoseconds of the last round that fanned out
}

// busyTurnInterval is how often a busy relay (full batches, back to back)
// also runs the retries that are due and serves the deliveries lane: a query
// on a small index each when there is nothing to do.
const busyTurnInterval = 250 * time.Millisecond

// The relays' adaptive poll. Watch triggers send no notification (a check
// per row inside the host's transaction cost a tenth of a watched table's
// write throughput), and a throttled notification leaves the transactions
// that commit just after it quiet; so after each wake-up, and each round that
// found rows, the idle relay looks again every firstRecheck for
// steadyRecheck, then after twice as long with every look that finds
// nothing, up to lastRecheck: about a second in all (or less, when
// PollInterval is shorter), then every PollInterval. Each look is one query
// on a small partial index. While writes flow (one every 16 ms or more
// often) they are found within milliseconds; after a longer lull, within
// about as long again as the lull.
const (
	firstRecheck  = 2 * time.Millisecond
	steadyRecheck = 16 * time.Millisecond
	lastRecheck   = 512 * time.Millisecond
)

// callbackQueue is how many OnPoison calls may wait in line.
const callbackQueue = 1000

// testHooks let tests in this package observe and steer the relay.
type testHooks struct {
	// claimFloor is the claim floor's rescan schedule (zero: the defaults).
	claimFloor claimfloor.Schedule
	// owedLook is how often the deliveries lane's claims look from the
	// start (zero: owedfloor.LookEvery).
	owedLook time.Duration
	// helperOwedRound is told the batch of each round of the deliveries
	// lane that a helper loop runs, and how long the loop rests after it.
	helperOwedRound func(batch int, rest time.Duration)
	// mainRound is told the lane of each round the main loop runs, and how
	// many rows (pending) or events (deliveries) it claimed.
	mainRound func(l lane, claimed int)
	// floorClaim is told where each pending-lane batch claim of the
	// relay's own starts (see claimfloor).
	floorClaim func(claimfloor.Claim)
	// afterInsert runs inside a round's transaction, after the jobs were
	// inserted and before the rows are stamped.
	afterInsert func(ctx context.Context, tx pgx.Tx)
	// pause replaces the relay's backoff pauses; it reports whether to go on.
	pause func(ctx context.Context, d time.Duration) bool
	// idle runs each time the relay has nothing to do and starts waiting.
	idle func()
	// charged runs for every failed attempt charged to an event, with the
	// pause before its next attempt.
	charged func(seq int64, attempt int, next time.Duration)
	// reconnectPause replaces the listener's pause before reconnecting.
	reconnectPause func(ctx context.Context, d time.Duration)
	// notified runs for every notification the listener receives.
	notified func()
	// pruning runs inside each retention batch's transaction, with the lock
	// held and the batch size.
	pruning func(size int)
	// prunePass runs at the start of every retention pass.
	prunePass func()
	// truncated runs after retention emptied a partition with TRUNCATE.
	truncated func(partition string)
	// polled runs each time the main loop's poll queries.
	polled func()
	// deadWorkerAfter replaces maintenance.DeadWorkerAfter (0: the constant).
	deadWorkerAfter time.Duration
	// rescued runs after each look for dead workers' heads.
	rescued func()
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
	return &Relay{pool: pool, config: cfg, logger: cfg.Logger, sql: sql, byName: map[string]*subscription{},
		svc:     startstop.Base{StopBeforeRestart: true}, // Stop unregisters the gauges
		metrics: metrics, meter: meter, tracer: newTracer(cfg.TracerProvider),
		laneAttr: [2]metric.MeasurementOption{
			metric.WithAttributes(attribute.String(attrLane, "pending")),
			metric.WithAttributes(attribute.String(attrLane, "deliveries")),
		}}, nil
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
		r.mu.Lock()
		defer r.mu.Unlock()
		r.launch(ctx, run)
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

// ownTx is how the relays and the workers begin their own transactions
// (rounds, retention, chain statements, an ordered subscriber's completion,
// its HandleTx handlers' run with it): READ COMMITTED, whatever the
// database's default_transaction_isolation. Their statements lock rows that
// other transactions update meanwhile (a chain's row, a River job's), and
// expect each statement to see what committed before it; under REPEATABLE
// READ such a lock fails with 40001 instead of waiting, and a handler's
// work would roll back for it. A host's transaction (FanoutTx, Record) and
// an unordered HandleTx handler's, which locks only its own job, keep the
// database's level.
var ownTx = pgx.TxOptions{IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadWrite}

// errLastRunLingers refuses a run, or a FanoutTx call, while an OnPoison
// call of the last run, left running by a Stop that gave up, has not
// returned: the new one would call OnPoison alongside it.
var errLastRunLingers = fmt.Errorf("%w: an OnPoison call of the last run is still running: wait for Stopped", ErrStarted)

// prepare is the part of Start that may fail: the client's schema checked,
// the subscribers registered, the gauges; then the health and heartbeat
// state of a new run. It runs while the service is starting, without mu.
func (r *Relay) prepare(ctx context.Context, run *startstop.Run, client *river.Client[pgx.Tx]) error {
	if err := r.checkSchema(client); err != nil {
		return err
	}
	if err := r.register(ctx, r.pool); err != nil {
		return err
	}
	r.client = client
	if r.config.MeterProvider != nil {
		gauges, err := r.registerGauges()
		if err != nil {
			return fmt.Errorf("events: relay metrics: %w", err)
		}
		run.OnStop(func() { _ = gauges.Unregister() })
	}
	r.failing.Store(0)
	r.lastSuccess.Store(time.Now().UnixNano())
	if last := r.beat.Load(); last != nil {
		// The last run's row is marked stopped again: its Stop marks it
		// within a second and may have failed. Left unmarked, it looks like
		// a dead process of this River client, and the dead-worker rescue
		// (ChainRescue) would take the heads this live process runs.
		if err := last.MarkStopped(ctx); err != nil {
			r.logger.WarnContext(ctx, "events: marking the last run stopped failed: until it is, the relays may take this process for dead",
				slog.String("run", last.RunID.String()), slog.String("err", err.Error()))
		}
	}
	// The run's claims start at the relays' last claim floor (see
	// claimfloor); without one, from the start.
	r.startFloor, r.serverStart = 0, time.Time{}
	var floor *int64
	if err := r.pool.QueryRow(ctx, r.sql.ClaimFloors).Scan(&floor); err != nil {
		r.logger.WarnContext(ctx, "events: reading the relays' claim floors failed: the first claims start from the start",
			slog.String("err", err.Error()))
	} else if floor != nil {
		r.startFloor = *floor
	}
	r.lastRound.Store(0)
	r.beat.Store(r.newHeartbeat())
	return nil
}

// launch adds the run's goroutines: the listener (unless PollOnly), the
// main loop and its helpers, retention and heartbeats, all graceful but the
// listener; and the OnPoison queue, which the run drains once they have
// returned (only rounds queue callbacks). The caller holds mu.
func (r *Relay) launch(ctx context.Context, run *startstop.Run) {
	r.run = run
	r.claimFloor = &claimfloor.Floor{Schedule: r.hooks.claimFloor}
	r.claimFloor.Start(r.startFloor, time.Now())
	r.owedFloors = &owedfloor.Floors{LookEvery: r.hooks.owedLook}
	r.callbacks = hostcall.Start(ctx, r.logger, callbackQueue)
	run.Drain(r.callbacks)
	r.reconnected, r.wake, r.helpWake, r.floorLookSoon = wake.New(), wake.New(), wake.New(), wake.New()
	r.listener.Store(r.config.Listener.listen(run, r.pool, r.logger, &listener.Listener{
		Channels: []string{r.sql.ChannelEvents},
		OnNotify: func(string, string) {
			if r.hooks.notified != nil {
				r.hooks.notified()
			}
			r.wake.Send()
		},
		OnConnect: func(reconnect bool) {
			if reconnect {
				r.metrics.reconnects.Add(context.Background(), 1)
			}
			if reconnect {
				// A crash may have lost rounds' commits (synchronous_commit
				// off) that moved the claim floor: look below it.
				r.lookBelowSoon()
			}
			r.reconnected.Send() // the database answers: end any backoff
			r.wake.Send()        // notifications sent while away are lost: look now
		},
		Sleep: r.hooks.reconnectPause,
	}))
	// The heartbeat marks the run stopped once its rounds have ended, with
	// the floor their last claims left.
	rounds := &sync.WaitGroup{}
	rounds.Add(r.config.MaxRoundsInFlight)
	run.GoGraceful(func(ctx context.Context) { defer rounds.Done(); r.loop(ctx) })
	for range r.config.MaxRoundsInFlight - 1 {
		run.GoGraceful(func(ctx context.Context) { defer rounds.Done(); r.helper(ctx) })
	}
	r.beat.Load().RoundsEnded = rounds.Wait
	run.GoGraceful(r.pruner)
	run.GoGraceful(r.heartbeater)
	run.GoGraceful(r.chainSweeper)
	run.GoGraceful(r.floorLooker)
}

// listening reports whether the run learns of new events without polling:
// its LISTEN is in effect, or it polls only (polling is all there is).
func (r *Relay) listening() bool {
	l := r.listener.Load()
	return l == nil || l.Listening()
}

// register registers the relay's subscribers and sets the run's active set.
// A lost connection is retried a few times: Start should not fail on a blip.
func (r *Relay) register(ctx context.Context, db DB) error {
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
		if err == nil || attempt == 3 || !isTransient(err) || ctx.Err() != nil {
			break
		}
		_ = backoff.Sleep(ctx, backoff.Delay(attempt, 100*time.Millisecond, time.Second))
	}
	if err != nil {
		return fmt.Errorf("events: relay: registering subscribers: %w", err)
	}
	r.active, r.known = nil, []string{}
	for _, s := range r.subs {
		if slices.Contains(retired, s.Name) {
			r.logger.WarnContext(ctx, "events: subscriber was retired; this relay will not fan out to it",
				slog.String("subscriber", s.Name))
			continue
		}
		r.active = append(r.active, s)
		r.known = append(r.known, s.Name)
	}
	return nil
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

// stopping reports whether the run is stopping; never for a FanoutTx call.
func (r *Relay) stopping() bool { return r.run.IsStopping() }

// loop is the relay's main loop. It runs rounds until stopped: straight on
// after a full batch (and wakes a helper loop to claim alongside), otherwise
// it serves the deliveries lane and then waits — for a notification, for the
// next re-check after activity (see firstRecheck), or for the next poll,
// which reads in one query whether pending rows wait (watch triggers send no
// notification, and one may have been throttled or lost) and when the next
// failed event is due.
func (r *Relay) loop(ctx context.Context) {
	l := &mainLoop{r: r, claim: true}
	for !r.stopping() && ctx.Err() == nil {
		if l.claim {
			again, ok := l.claimPass(ctx)
			if !ok {
				return
			}
			if again {
				continue
			}
		}
		if !l.idlePass(ctx) {
			return
		}
	}
}

// mainLoop is what the main loop carries from one pass to the next.
type mainLoop struct {
	r         *Relay
	failures  int           // rounds and polls failed in a row
	pollAt    time.Time     // when an idle relay polls next
	turnsAt   time.Time     // when a busy relay gives the other duties their turn next
	lull      time.Duration // how long the idle relay waits before its next re-check (0: no re-checks)
	activeAt  time.Time     // the last wake-up, or round that found rows
	foundNone bool          // the last claim found nothing (the rows the poll saw are locked, or taken)
	claim     bool          // whether the next pass starts with a batch round
	recheck   bool          // the next pass is a re-check (see firstRecheck): poll only
}

// claimPass runs a batch round of the pending lane, then, while the
// deliveries lane has a backlog, one round of it — unless fresh events flow
// and the helper loops drain the backlog (owedHelped), when this loop stays
// on the pending lane. It reports whether to claim again at once (a batch
// came back full, or owed deliveries may still be due, or a batch failed and was
// retried row by row) and whether to go on at all.
func (l *mainLoop) claimPass(ctx context.Context) (again, ok bool) {
	r := l.r
	listened := r.listening()
	claimed, err := r.round(ctx, lanePending, r.sql.ClaimBatch, int64(r.config.BatchSize))
	if err != nil {
		if !l.failed(ctx, err) {
			return false, false
		}
		// One bad row must not hold back the rest: retry the batch row by
		// row, so the bad one is found and charged alone.
		if err := r.rowByRow(ctx, lanePending, claimed); err != nil && ctx.Err() == nil {
			r.logger.WarnContext(ctx, "events: row-by-row retry interrupted", slog.String("err", err.Error()))
		}
		return true, true
	}
	l.succeeded()
	if r.hooks.mainRound != nil {
		r.hooks.mainRound(lanePending, len(claimed))
	}
	if listened {
		// Listening (or polling only), and caught up with what was there
		// before.
		r.run.MarkReady()
	}
	l.foundNone = len(claimed) == 0
	if !l.foundNone {
		l.active() // writes flow
	}
	r.fresh.claimed(time.Now(), len(claimed))
	full := len(claimed) == r.config.BatchSize
	r.busy.Store(full)
	if full {
		r.helpWake.Send() // plenty of work: a helper loop may join
	}
	helped := r.owedHelped()
	// The busy turn's round of the deliveries lane looks for a backlog
	// nobody has found yet; one that is known gets its round below, and two
	// rounds in a row would hold the next fresh event back twice.
	owedDue := r.owedBusy.Load()
	if (full || owedDue) && !l.otherTurns(ctx, !helped && !owedDue) {
		return false, false
	}
	owed := false
	switch {
	case helped:
		// The deliveries lane has a backlog while fresh events flow, and
		// the helper loops serve it: this loop stays on the pending lane,
		// so a fresh event never waits for a round of the backlog.
		r.helpWake.Send()
		return full, true
	case owedDue:
		// A backlog and room for it (no fresh events, or one round in
		// flight): its round follows every pending one.
		owed, ok = r.owedPass(ctx, l.failed)
	default:
		return full, true // the idle pass serves the deliveries lane
	}
	if owed {
		r.helpWake.Send()
	}
	return full || owed, ok
}

// otherTurns keeps a busy main loop (full batches, or a backlog of owed
// deliveries, back to back: it never idles, where the poll would run them) from
// starving its other duties: four times a second it also runs the retries
// that are due and, with owed, a round of the deliveries lane (retention
// runs on its own goroutine and takes its own turns). Without owed the
// helper loops serve that lane while fresh events flow: a round of it here
// would hold the fresh events back. It reports whether to go on.
func (l *mainLoop) otherTurns(ctx context.Context, owed bool) bool {
	if !time.Now().After(l.turnsAt) {
		return true
	}
	l.turnsAt = time.Now().Add(busyTurnInterval)
	if err := l.r.retryDue(ctx); err != nil && !l.failed(ctx, err) {
		return false
	}
	if !owed {
		return true
	}
	_, ok := l.r.owedPass(ctx, l.failed)
	return ok
}

// idlePass follows a batch that was not full: it serves the deliveries lane
// (unless this pass is a re-check), polls, and waits — for a notification,
// the next re-check, or the next poll. It sets what the
// next pass does and reports whether to go on.
func (l *mainLoop) idlePass(ctx context.Context) bool {
	r := l.r
	if !l.recheck && !r.owedHelped() {
		owed, ok := r.owedPass(ctx, l.failed)
		if !ok {
			return false
		}
		if owed {
			l.claim = true // a backlog: a pending round, then the next owed one
			r.helpWake.Send()
			return true
		}
	}
	if l.recheck {
		l.pollAt = time.Time{} // look now
	}
	next, err := r.poll(ctx, &l.pollAt)
	if err != nil {
		l.claim = true
		return l.failed(ctx, err)
	}
	l.succeeded()
	if next == 0 {
		l.claim, l.recheck = true, false // rows wait, or retries ran
		return true
	}
	// A look that found nothing counts as empty, and so does one whose claim
	// found nothing: rows that another session holds locked (a stuck round,
	// a long FanoutTx) must not keep this relay re-checking every 2 ms.
	if (l.recheck || l.foundNone) && time.Since(l.activeAt) >= steadyRecheck {
		l.lull *= 2 // nothing there for a while: look again later
	}
	rechecking := l.lull > 0 && l.lull <= min(lastRecheck, r.config.Listener.PollInterval)
	if rechecking {
		next = min(next, l.lull)
	} else {
		l.lull = 0
	}
	switch {
	case r.wait(ctx, next):
		l.claim, l.recheck = true, false
		l.active()
	case rechecking && time.Until(l.pollAt) > 0:
		l.claim, l.recheck = false, true
	default:
		l.claim, l.recheck = false, false // time to poll
	}
	return true
}

// active starts the re-checks over: a wake-up came, or a round found rows.
func (l *mainLoop) active() {
	l.lull, l.activeAt = firstRecheck, time.Now()
}

// failed counts a failed round or poll and backs off, longer with every
// failure in a row. It reports whether to go on: never once the relay is
// stopping.
func (l *mainLoop) failed(ctx context.Context, err error) bool {
	r := l.r
	if r.stopping() || ctx.Err() != nil {
		return false
	}
	l.failures++
	r.failing.Store(int32(min(l.failures, 1<<30)))
	d := backoff.Delay(l.failures, r.config.RetryBackoff, r.config.MaxRetryBackoff)
	if isTransient(err) {
		// The database is away (a restart, a failover): looking again costs
		// a connection attempt, so look at least every poll interval, and at
		// once when the listener is back. A crash may have lost rounds'
		// commits that moved the claim floor: look below it once back.
		d = min(d, r.config.Listener.PollInterval)
		r.lookBelowSoon()
	}
	r.logger.WarnContext(ctx, "events: relay round failed; backing off",
		slog.String("err", err.Error()), slog.Int("failures", l.failures), slog.Duration("pause", d))
	return r.pause(ctx, d, r.reconnected)
}

// succeeded clears the failures after a round or poll that worked.
func (l *mainLoop) succeeded() {
	l.failures = 0
	l.r.failing.Store(0)
	l.r.lastSuccess.Store(time.Now().UnixNano())
	// A reconnect before this success says nothing about a later failure:
	// only one after it may end that failure's backoff.
	l.r.reconnected.Clear()
}

// helper is an extra loop for rounds in flight: woken by a loop whose batch
// came back full, or whose deliveries round found deliveries, it runs rounds of
// the busy lanes alongside, in turn, while they stay busy. Waiting for
// notifications, polling, retries and the row-by-row retries are the main
// loop's.
func (r *Relay) helper(ctx context.Context) {
	failures := 0
	for !r.stopping() && ctx.Err() == nil {
		select {
		case <-r.helpWake:
		case <-r.run.Stopping():
			return
		case <-ctx.Done():
			return
		}
		pending := r.busy.Load()
		contended := false // the last round of the backlog met fresh events
		for !r.stopping() && ctx.Err() == nil {
			// Read each time: the lane may have found a backlog since.
			owed := r.owedBusy.Load()
			if !pending && !owed {
				break
			}
			var err error
			if pending {
				var claimed []int64
				claimed, err = r.round(ctx, lanePending, r.sql.ClaimBatch, int64(r.config.BatchSize))
				pending = err == nil && len(claimed) == r.config.BatchSize
				r.fresh.claimed(time.Now(), len(claimed))
			}
			if err == nil && owed {
				batch := r.config.BatchSize
				if contended {
					batch = r.shortOwedBatch()
				}
				began := time.Now()
				_, owed, err = r.owedRound(ctx, batch)
				took := time.Since(began)
				// Fresh events come first: a round of the backlog that met
				// them (a pending round found rows while it ran, or just
				// before) is followed by short rounds that rest owedYield
				// times as long as they took, at most owedRestMax, so that
				// the backlog takes at most a third of this loop's time
				// while fresh events contend for the machine. A trickle of
				// them does not flow (freshFlowing): the backlog drains at
				// full speed. So does a loop that has pending rounds of
				// its own to run.
				contended = err == nil && owed && !pending && r.freshFlowing() && !r.fresh.last().Before(began.Add(-took))
				rest := time.Duration(0)
				if contended {
					rest = min(owedYield*took, owedRestMax)
				}
				if r.hooks.helperOwedRound != nil {
					r.hooks.helperOwedRound(batch, rest)
				}
				if rest > 0 && r.sleep(ctx, rest, nil) == sleepStopped {
					return
				}
			}
			if err != nil {
				// The main loop retries row by row, and serves the
				// deliveries lane meanwhile; this one backs off.
				r.owedBusy.Store(false)
				failures++
				if !r.pause(ctx, backoff.Delay(failures, r.config.RetryBackoff, r.config.MaxRetryBackoff), nil) {
					return
				}
				break
			}
			failures = 0
			if pending || owed {
				r.helpWake.Send()
			}
		}
	}
}

// poll reads, at most every PollInterval (and sooner when a failed event is
// due, or this relay has just failed one), whether pending rows wait and when
// the next failed event is due. It returns 0 when rows wait or after running
// due retries, else how long the loop may wait before polling again.
func (r *Relay) poll(ctx context.Context, pollAt *time.Time) (time.Duration, error) {
	if !r.retryCheck.Swap(false) && time.Now().Before(*pollAt) {
		return time.Until(*pollAt), nil
	}
	var (
		waiting bool
		secs    *float64
	)
	if r.hooks.polled != nil {
		r.hooks.polled()
	}
	// From the claim floor (see claimfloor). The oldest transaction running (xmin) tells whether transaction IDs
	// went back (a failover to a server that was behind): then events wait
	// below the floor, and the next claim starts from 0.
	look := r.claimFloor.Look()
	var (
		xmin        int64
		serverStart time.Time
	)
	// From the owed floors, taking no look: a pair below one (a long
	// transaction's, committed late) waits for a claim's look.
	fromDue, fromSeq := floorArgs(r.owedFloors.Peek(r.known))
	if err := r.pool.QueryRow(ctx, r.sql.Poll, r.known, look.From, look.FromSeq, look.Running, fromDue, fromSeq).Scan(&waiting, &secs, &xmin, &serverStart); err != nil {
		return 0, err
	}
	if r.claimFloor.Check(look, xmin) {
		waiting = true
	}
	if !r.serverStart.IsZero() && !serverStart.Equal(r.serverStart) {
		r.lookBelowSoon() // restarted: a crash may have lost rounds' commits
	}
	r.serverStart = serverStart
	interval := r.config.Listener.PollInterval
	*pollAt = time.Now().Add(interval)
	if secs != nil {
		next := time.Duration(*secs * float64(time.Second))
		if next <= 0 {
			return 0, r.retryDue(ctx)
		}
		if next < interval {
			*pollAt = time.Now().Add(next)
		}
	}
	if waiting {
		return 0, nil
	}
	return time.Until(*pollAt), nil
}

// pause sleeps d unless the relay stops first; it reports whether to go on.
// A wake-up on early (nil: none) ends it early too: the main loop's backoff
// after a failed round ends when the listener (re)connects, since the
// database is back.
func (r *Relay) pause(ctx context.Context, d time.Duration, early wake.Signal) bool {
	if r.hooks.pause != nil {
		return r.hooks.pause(ctx, d) && !r.stopping()
	}
	return r.sleep(ctx, d, early) != sleepStopped
}

// wait blocks until a notification, a stop, or the timer of next; it reports
// whether it was anything but the timer.
func (r *Relay) wait(ctx context.Context, next time.Duration) bool {
	if r.hooks.idle != nil {
		r.hooks.idle()
	}
	return r.sleep(ctx, max(next, time.Millisecond), r.wake) != sleepTimedOut
}

// sleepEnd is what ended a relay's sleep.
type sleepEnd int

const (
	sleepTimedOut sleepEnd = iota
	sleepWoken             // by the early signal
	sleepStopped           // the run is stopping, or ctx ended
)

// sleep waits d unless early (nil: never) sends or the relay stops first,
// and says which it was.
func (r *Relay) sleep(ctx context.Context, d time.Duration, early wake.Signal) sleepEnd {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return sleepTimedOut
	case <-early:
		return sleepWoken
	case <-r.run.Stopping():
	case <-ctx.Done():
	}
	return sleepStopped
}
