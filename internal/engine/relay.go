// Package engine is the relay's delivery engine: every (event, subscriber)
// delivery goes through it, whatever brought it there — a fresh event, a
// retry, a paused subscriber resumed, a rolling deploy, a backfill, an
// ordered subscriber's deferral. It claims rows (round.go: the pending lane
// of fresh events, FOR UPDATE SKIP LOCKED from the claim floor; owed.go: the
// deliveries lane of owed pairs, from each subscriber's floor), plans their
// jobs (plan.go, coalesce.go, chains.go), inserts them through River and
// stamps the rows in the same transaction, charges and poisons what failed
// (charges.go), and runs the loops that drive the rounds (loop.go), the
// looks below the claim floor (floor.go) and the background duties of
// package maintenance (duties.go). probe.go holds the steps that tests
// drive one at a time. Its database tests (package engine_test: *_db_test.go)
// run the engine alone on a real PostgreSQL, migrated by the root package.
//
// The root package keeps the user's words: its Relay holds one engine
// Relay, builds its Config from RelayConfig, and hands it each Subscriber as
// a Subscription whose Job maps an Event (the same fields as the root
// package's Event, so either converts to the other) to a River job.
package engine

import (
	"context"
	"encoding/json"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/standmeet/events/internal/claimfloor"
	"github.com/standmeet/events/internal/glob"
	"github.com/standmeet/events/internal/hostcall"
	"github.com/standmeet/events/internal/listener"
	"github.com/standmeet/events/internal/maintenance"
	"github.com/standmeet/events/internal/owedfloor"
	"github.com/standmeet/events/internal/startstop"
	"github.com/standmeet/events/internal/statements"
	"github.com/standmeet/events/internal/wake"
)

// Event is an event as the engine reads it: the fields of the root
// package's Event, in its order, so that each converts to the other.
type Event struct {
	ID        uuid.UUID
	Seq       int64
	Type      string
	Subject   string
	Scope     string
	Payload   json.RawMessage
	CreatedAt time.Time
}

// Mapped is a subscriber's job for one event: its args (nil: no job), the
// subscriber's insert options, and what the engine reads of the args itself
// (their Kind, and their own InsertOpts' tags).
type Mapped struct {
	Args river.JobArgs
	Opts *river.InsertOpts
	Kind string
	Tags []string
	// Unique is set when the args' own InsertOpts ask for a unique job.
	Unique bool
}

// Subscription is a validated subscriber, as the engine serves it. Build
// one with NewSubscription.
type Subscription struct {
	Name     string
	Patterns []glob.Pattern
	// TypesRE is one regular expression for every pattern, matched in SQL
	// against '.' || type.
	TypesRE  string
	Coalesce bool
	Ordered  bool
	// Continue: an ordered subscriber's chain moves on past a discarded
	// head (rather than blocking).
	Continue bool
	// Job maps an event to the subscriber's job: host code, whose panic it
	// returns as an error.
	Job func(ctx context.Context, e Event) (Mapped, error)

	// tags holds the one River tag of this subscriber's jobs, shared by
	// jobs with no tags of their own (River only reads it); chainTags adds
	// the ordered tag, for an ordered subscriber's jobs placed in a chain.
	tags, chainTags []string
	// metricAttrs label this subscriber's measurements.
	metricAttrs metric.MeasurementOption
}

// TagSubscriber prefixes the tag of a subscriber's jobs.
const TagSubscriber = "events-subscriber-"

// NewSubscription returns s ready to serve: its jobs' tags and its
// measurements' labels set. (A run, or a FanoutIn call, readies a
// Subscription built otherwise.)
func NewSubscription(s Subscription) *Subscription {
	s.ready()
	return &s
}

// ready sets the jobs' tags and the measurements' labels, once.
func (s *Subscription) ready() {
	if s.tags != nil {
		return
	}
	s.tags = []string{TagSubscriber + s.Name}
	if s.Ordered {
		s.chainTags = []string{TagSubscriber + s.Name, TagOrdered}
	}
	s.metricAttrs = metric.WithAttributes(attribute.String(AttrSubscriber, s.Name), attribute.String(attrMessagingSystem, "river"))
}

// Matches reports whether the subscriber takes events of type eventType.
func (s *Subscription) Matches(eventType string) bool {
	for _, p := range s.Patterns {
		if p.Match(eventType) {
			return true
		}
	}
	return false
}

// jobFor maps e to the subscriber's job.
func (s *Subscription) jobFor(ctx context.Context, e Event) (mapped, error) {
	j, err := s.Job(ctx, e)
	if err != nil || j.Args == nil {
		return mapped{}, err
	}
	return mapped{sub: s, args: j.Args, opts: j.Opts, kind: j.Kind, tags: j.Tags, unique: j.Unique || AsksUnique(j.Opts)}, nil
}

// AsksUnique reports whether opts ask River for a unique job (any of its
// UniqueOpts set, as River reads them).
func AsksUnique(opts *river.InsertOpts) bool {
	return opts != nil && !reflect.ValueOf(opts.UniqueOpts).IsZero()
}

// Config is what the engine takes of the root package's RelayConfig, with
// its defaults applied.
type Config struct {
	BatchSize         int
	MaxAttempts       int
	RetryBackoff      time.Duration
	MaxRetryBackoff   time.Duration
	MaxRoundsInFlight int
	PollInterval      time.Duration
	Retention         time.Duration
	RetentionInterval time.Duration
	OrphanAfter       time.Duration
	PollOnly          bool
	OnPoison          func(ctx context.Context, e Event, err error)
	Logger            *slog.Logger
	// Listen starts a run's listener, with l holding the engine's part
	// (channels, callbacks), and returns it; nil when the relay polls only.
	Listen  func(run *startstop.Run, l *listener.Listener) *listener.Listener
	Metrics Metrics
	Tracer  trace.Tracer
}

// Beginner starts a transaction: the pool, or a transaction (a savepoint).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Relay is one relay's engine: its rounds, loops and background duties,
// and their state. The root package's Relay owns one.
type Relay struct {
	// Hooks let the root package's tests observe and steer the engine. Set
	// them before the run starts.
	Hooks Hooks

	pool     *pgxpool.Pool
	config   Config
	laneAttr [2]metric.MeasurementOption
	sql      *statements.Set // the statements of the relay's schema

	// Health, for the root package's Health and Healthy.
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
	// subscriber (package owedfloor): set by Launch, for one run.
	owedFloors *owedfloor.Floors

	// claimFloor is where the pending lane's batch claims start (see
	// package claimfloor): set by Launch, for one run, before its loops.
	claimFloor *claimfloor.Floor
	// startFloor is where the next run's claims start: the relays' last
	// claim floor, read by Prepare (0: from the start).
	startFloor int64

	// Set by Prepare and Launch, for one run, or by FanoutIn, for one call
	// (with config). Read by the
	// run's (or the call's) own goroutines. The caller keeps runs and
	// FanoutIn calls apart, and begins neither while the last one's
	// goroutines or OnPoison calls run (the root package's lifecycle and
	// its inTx guard): so these need no lock.
	run       *startstop.Run // nil for FanoutIn: never stopping
	client    *river.Client[pgx.Tx]
	active    []*Subscription // the subscribers served: less the retired ones
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

	// Heartbeats (duties.go): the run's, and what they report.
	beat      atomic.Pointer[maintenance.Heartbeat]
	lastRound atomic.Int64 // unix nanoseconds of the last round that fanned out

	// noCopy is set when the run's River client is not on River's own pgx
	// driver (Prepare), or once a COPY insert failed where River's INSERT
	// did not (copyFailed): the run's rounds insert with InsertManyTx.
	noCopy atomic.Bool
}

// Hooks let tests observe and steer the engine.
type Hooks struct {
	// ClaimFloor is the claim floor's rescan schedule (zero: the defaults).
	ClaimFloor claimfloor.Schedule
	// OwedLook is how often the deliveries lane's claims look from the
	// start (zero: owedfloor.LookEvery).
	OwedLook time.Duration
	// OwedRound is told, before each round of the deliveries lane a loop
	// runs, whether a helper loop runs it and how many deliveries it may
	// claim.
	OwedRound func(helper bool, batch int)
	// MainRound is told the lane of each round the main loop runs, and how
	// many rows (pending) or events (deliveries) it claimed.
	MainRound func(l Lane, claimed int)
	// FloorClaim is told where each pending-lane batch claim of the
	// relay's own starts (see claimfloor).
	FloorClaim func(claimfloor.Claim)
	// AfterInsert runs inside a round's transaction, after the jobs were
	// inserted and before the rows are stamped.
	AfterInsert func(ctx context.Context, tx pgx.Tx)
	// Pause replaces the relay's backoff pauses; it reports whether to go on.
	Pause func(ctx context.Context, d time.Duration) bool
	// Idle runs each time the relay has nothing to do and starts waiting.
	Idle func()
	// Charged runs for every failed attempt charged to an event, with the
	// pause before its next attempt.
	Charged func(seq int64, attempt int, next time.Duration)
	// ReconnectPause replaces the listener's pause before reconnecting.
	ReconnectPause func(ctx context.Context, d time.Duration)
	// Notified runs for every notification the listener receives.
	Notified func()
	// Pruning runs inside each retention batch's transaction, with the lock
	// held and the batch size.
	Pruning func(size int)
	// PrunePass runs at the start of every retention pass.
	PrunePass func()
	// Truncated runs after retention emptied a partition with TRUNCATE.
	Truncated func(partition string)
	// Polled runs each time the main loop's poll queries.
	Polled func()
	// DeadWorkerAfter replaces maintenance.DeadWorkerAfter (0: the constant).
	DeadWorkerAfter time.Duration
	// Rescued runs after each look for dead workers' heads.
	Rescued func()
}

// New returns the engine of a relay that reads events through pool, with
// the statements of its schema.
func New(pool *pgxpool.Pool, sql *statements.Set, config Config) *Relay {
	return &Relay{pool: pool, sql: sql, config: config,
		laneAttr: [2]metric.MeasurementOption{
			metric.WithAttributes(attribute.String(AttrLane, "pending")),
			metric.WithAttributes(attribute.String(AttrLane, "deliveries")),
		}}
}

// callbackQueue is how many OnPoison calls may wait in line.
const callbackQueue = 1000

// OwnTx is how the relays and the workers begin their own transactions
// (rounds, retention, chain statements, an ordered subscriber's completion,
// its HandleTx handlers' run with it): READ COMMITTED, whatever the
// database's default_transaction_isolation. Their statements lock rows that
// other transactions update meanwhile (a chain's row, a River job's), and
// expect each statement to see what committed before it; under REPEATABLE
// READ such a lock fails with 40001 instead of waiting, and a handler's
// work would roll back for it. A host's transaction (FanoutTx, Record) and
// an unordered HandleTx handler's, which locks only its own job, keep the
// database's level.
var OwnTx = pgx.TxOptions{IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadWrite}

// Prepare is the engine's part of a run's start (no other run, nor a
// FanoutIn call, may be running: see the run state), once the subscribers are
// registered: it takes config (the relay's, as it is now), serves active
// through client, resets the health, marks the last run's heartbeat
// stopped, reads where the claims start and makes the run's heartbeat.
func (r *Relay) Prepare(ctx context.Context, config Config, client *river.Client[pgx.Tx], active []*Subscription) {
	r.config = config
	r.client = client
	// River's COPY insert calls the driver itself, around the client's
	// pilot, which a plugin driver's (River Pro's) may need to see every
	// insert: COPY only with River's own pgx driver.
	_, plain := client.Driver().(*riverpgxv5.Driver)
	r.noCopy.Store(!plain)
	r.serve(active)
	r.failing.Store(0)
	r.lastSuccess.Store(time.Now().UnixNano())
	if last := r.beat.Load(); last != nil {
		// The last run's row is marked stopped again: its Stop marks it
		// within a second and may have failed. Left unmarked, it looks like
		// a dead process of this River client, and the dead-worker rescue
		// (ChainRescue) would take the heads this live process runs.
		if err := last.MarkStopped(ctx); err != nil {
			r.config.Logger.WarnContext(ctx, "events: marking the last run stopped failed: until it is, the relays may take this process for dead",
				slog.String("run", last.RunID.String()), slog.String("err", err.Error()))
		}
	}
	// The run's claims start at the relays' last claim floor (see
	// claimfloor); without one, from the start.
	r.startFloor, r.serverStart = 0, time.Time{}
	var floor *int64
	if err := r.pool.QueryRow(ctx, r.sql.ClaimFloors).Scan(&floor); err != nil {
		r.config.Logger.WarnContext(ctx, "events: reading the relays' claim floors failed: the first claims start from the start",
			slog.String("err", err.Error()))
	} else if floor != nil {
		r.startFloor = *floor
	}
	r.lastRound.Store(0)
	r.beat.Store(r.newHeartbeat())
}

// serve sets the subscribers the run (or the FanoutIn call) serves.
func (r *Relay) serve(active []*Subscription) {
	r.active, r.known = active, make([]string, len(active))
	for i, s := range active {
		s.ready()
		r.known[i] = s.Name
	}
}

// Launch adds the run's goroutines: the listener (unless the relay polls
// only), the main loop and its helpers, retention and heartbeats, all
// graceful but the listener; and the OnPoison queue, which the run drains
// once they have returned (only rounds queue callbacks).
func (r *Relay) Launch(ctx context.Context, run *startstop.Run) {
	r.run = run
	r.claimFloor = &claimfloor.Floor{Schedule: r.Hooks.ClaimFloor}
	r.claimFloor.Start(r.startFloor, time.Now())
	r.owedFloors = &owedfloor.Floors{LookEvery: r.Hooks.OwedLook}
	r.callbacks = hostcall.Start(ctx, r.config.Logger, callbackQueue)
	run.Drain(r.callbacks)
	r.reconnected, r.wake, r.helpWake, r.floorLookSoon = wake.New(), wake.New(), wake.New(), wake.New()
	r.listener.Store(r.config.Listen(run, &listener.Listener{
		Channels: []string{r.sql.ChannelEvents},
		OnNotify: func(string, string) {
			if r.Hooks.Notified != nil {
				r.Hooks.Notified()
			}
			r.wake.Send()
		},
		OnConnect: func(reconnect bool) {
			if reconnect {
				r.config.Metrics.Reconnects.Add(context.Background(), 1)
				// A crash may have lost rounds' commits (synchronous_commit
				// off) that moved the claim floor: look below it.
				r.lookBelowSoon()
			}
			r.reconnected.Send() // the database answers: end any backoff
			r.wake.Send()        // notifications sent while away are lost: look now
		},
		Sleep: r.Hooks.ReconnectPause,
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

// FanoutIn fans out, inside tx, every event pending now, for the root
// package's FanoutTx: rounds in savepoints of tx, with config, serving
// active through client, until a batch comes back short. It returns how many events it
// claimed. The caller keeps any run from starting meanwhile.
func (r *Relay) FanoutIn(ctx context.Context, tx pgx.Tx, config Config, client *river.Client[pgx.Tx], active []*Subscription) (int, error) {
	r.config = config
	callbacks := hostcall.Start(ctx, r.config.Logger, callbackQueue)
	r.client, r.run, r.callbacks = client, nil, callbacks
	r.serve(active)
	defer func() { _ = callbacks.Stop(context.WithoutCancel(ctx)) }() // waits for OnPoison calls; no deadline
	n := 0
	for {
		claimed, err := r.roundIn(ctx, tx, LanePending, false, r.sql.ClaimBatch, int64(r.config.BatchSize))
		n += len(claimed)
		if err != nil {
			return n, err
		}
		if len(claimed) < r.config.BatchSize {
			return n, nil
		}
	}
}

// Listening reports whether the run's LISTEN is in effect (never with
// PollOnly).
func (r *Relay) Listening() bool {
	l := r.listener.Load()
	return l != nil && l.Listening()
}

// listening reports whether the run learns of new events without polling:
// its LISTEN is in effect, or it polls only (polling is all there is).
func (r *Relay) listening() bool {
	l := r.listener.Load()
	return l == nil || l.Listening()
}

// LastSuccess is when the last round or poll worked.
func (r *Relay) LastSuccess() time.Time { return time.Unix(0, r.lastSuccess.Load()) }

// Failures counts the rounds and polls that failed in a row.
func (r *Relay) Failures() int { return int(r.failing.Load()) }

// Busy reports whether the last pending round came back full.
func (r *Relay) Busy() bool { return r.busy.Load() }

// Heartbeat is the current (or last) run's heartbeat; nil before the first.
func (r *Relay) Heartbeat() *maintenance.Heartbeat { return r.beat.Load() }

// ClaimFloor is the current (or last) run's claim floor; nil before the
// first run.
func (r *Relay) ClaimFloor() *claimfloor.Floor { return r.claimFloor }
