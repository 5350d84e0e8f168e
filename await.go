package events

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/standmeet/events/internal/backoff"
	"github.com/standmeet/events/internal/engine"
	"github.com/standmeet/events/internal/listener"
	"github.com/standmeet/events/internal/logging"
	"github.com/standmeet/events/internal/notifylimit"
	"github.com/standmeet/events/internal/startstop"
	"github.com/standmeet/events/internal/statements"
	"github.com/standmeet/events/internal/wake"
)

// Receipt says that an event has become River jobs.
type Receipt struct {
	EventID uuid.UUID
	// Fanout maps each subscriber that got a job to the River job's ID (for a
	// coalesced event, the job it was folded into). Empty when no subscriber
	// matched. A relay's round commits without waiting for its WAL flush
	// (see the README's Guarantees): after a crash of the database server
	// within a moment of the receipt, the event is fanned out again, to jobs
	// with other IDs.
	Fanout map[string]int64
	// FannedOutAt is when the relay committed the jobs.
	FannedOutAt time.Time
	// Owed names the matching subscribers that have no job yet, when the
	// receipt was read: one whose Map failed (it is retried, for that
	// subscriber alone), one paused, or one the stamping relay did not know
	// (a rolling deploy). A relay that knows it delivers it later; the
	// event's Fanout then names the job. Nil when none.
	Owed []string
	// Poisoned maps each subscriber for which the event is poisoned (its
	// Map failed MaxAttempts times; see [Outbox.Requeue]) to the last
	// error. Nil when none.
	Poisoned map[string]string
}

// AwaiterConfig configures an [Awaiter]. The zero value works.
type AwaiterConfig struct {
	// Outbox is the schema whose events the awaiter waits for. The zero
	// Outbox is the search_path's.
	Outbox Outbox

	// NotFoundGrace is how long [Awaiter.AwaitFanout] waits for an ID it
	// cannot see before returning ErrNotFound. It covers a writer that calls
	// AwaitFanout while its commit is still on the way; a writer that awaits
	// after its commit returned never needs it. Defaults to
	// NotFoundGraceDefault (2 s).
	NotFoundGrace time.Duration

	// Listener configures the awaiter's listening connection.
	Listener ListenerConfig

	// MeterProvider receives the awaiter's metrics (MetricReceipts and
	// MetricReceiptDuration, by outcome). Nil means none.
	MeterProvider metric.MeterProvider

	// Logger receives the awaiter's logs. Defaults to warnings and errors on
	// standard error.
	Logger *slog.Logger
}

func (c *AwaiterConfig) withDefaults() AwaiterConfig {
	out := *c
	out.NotFoundGrace = cmp.Or(out.NotFoundGrace, NotFoundGraceDefault)
	out.Listener = out.Listener.withDefaults()
	out.Logger = cmp.Or(out.Logger, logging.Default())
	out.Outbox = out.Outbox.withDefaults()
	return out
}

func (c *AwaiterConfig) validate() error {
	if err := c.Outbox.Validate(); err != nil {
		return err
	}
	if c.NotFoundGrace < 0 {
		return invalidf(ErrInvalidConfig, "NotFoundGrace", "%v: must not be negative", c.NotFoundGrace)
	}
	return c.Listener.validate()
}

// Awaiter gives write receipts: [Awaiter.AwaitFanout] blocks until events
// have been fanned out by any relay in any process. One Awaiter per process
// serves any number of concurrent waiters over a single listening
// connection; it needs no relay in the same process.
type Awaiter struct {
	pool    *pgxpool.Pool
	config  AwaiterConfig
	sql     *statements.Set
	metrics awaiterMetrics

	// reconnectPause replaces the listener's pause before reconnecting
	// (tests).
	reconnectPause func(ctx context.Context, d time.Duration)

	// svc is the awaiter's lifecycle. A run that ends with its Start context
	// is over: the awaiter may be started again without Stop.
	svc startstop.Base

	kick             wake.Signal   // to the kicker: wake the relays
	kickAfter        time.Duration // see kickAfter (a constant but in tests)
	kickAtOnceWithin time.Duration // see kickAtOnceWithin (likewise)

	mu      sync.Mutex
	waiters map[uuid.UUID]map[*waiter]struct{}
}

type waiter struct {
	wake wake.Signal // a notification or a reconnect: read again
}

// NewAwaiter returns an awaiter reading through pool. Call
// [Awaiter.Start] before waiting. A nil config means the defaults.
func NewAwaiter(pool *pgxpool.Pool, config *AwaiterConfig) (*Awaiter, error) {
	if pool == nil {
		return nil, invalidf(ErrInvalidConfig, "pool", "is nil")
	}
	if config == nil {
		config = &AwaiterConfig{}
	}
	cfg := config.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	sql, err := statementsFor(cfg.Outbox.Schema)
	if err != nil {
		return nil, err
	}
	metrics, err := newAwaiterMetrics(cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("events: awaiter metrics: %w", err)
	}
	return &Awaiter{pool: pool, config: cfg, sql: sql, metrics: metrics, kick: wake.New(), kickAfter: kickAfter, kickAtOnceWithin: kickAtOnceWithin,
		waiters: map[uuid.UUID]map[*waiter]struct{}{}}, nil
}

// Start opens the listening connection (in the background; it reconnects
// whenever it is lost; with [ListenerConfig.PollOnly], it polls instead) and
// returns. Cancelling ctx stops the awaiter like
// [Awaiter.Stop]: waits in progress return an error wrapping
// [ErrNotRunning], and so do later calls, at once.
func (a *Awaiter) Start(ctx context.Context) error {
	err := a.svc.Start(ctx, func(run *startstop.Run) error {
		// Every waiter's rows are re-read every PollInterval, listening or
		// not: a listening connection can die silently (until the ping finds
		// out) and a notification can be lost, so no receipt waits on a
		// socket longer than that.
		run.Go(a.pollLoop)
		run.Go(a.kicker)
		l := a.config.Listener.listen(run, a.pool, a.config.Logger, &listener.Listener{
			Channels:        []string{a.sql.ChannelFanned},
			ApplicationName: listener.AwaiterApplicationName,
			OnNotify:        func(_, payload string) { a.notified(payload) },
			OnConnect: func(bool) {
				a.pokeAll() // notifications sent while away are lost: re-check
				run.MarkReady()
			},
			Sleep: a.reconnectPause,
		})
		if l == nil {
			run.MarkReady() // PollOnly: polling is all there is
		}
		return nil
	})
	if err != nil {
		return ErrStarted // a run is active: the base's only refusal here
	}
	return nil
}

// pollLoop is the PollOnly awaiter's stand-in for the listener, and the
// listening one's safety net: every PollInterval it reads, in one query, the
// events that waiters wait for, and wakes the waiters of those fanned out or
// poisoned.
func (a *Awaiter) pollLoop(ctx context.Context) {
	every := a.config.Listener.PollInterval
	startstop.Every(ctx, nil, every, every, func() {
		if err := a.poll(ctx); err != nil && ctx.Err() == nil {
			a.config.Logger.WarnContext(ctx, "events: awaiter poll failed", slog.String("err", err.Error()))
		}
	})
}

// poll reads which of the events waited for are fanned out or poisoned, and
// wakes their waiters.
func (a *Awaiter) poll(ctx context.Context) error {
	a.mu.Lock()
	ids := make([]string, 0, len(a.waiters))
	for id := range a.waiters {
		ids = append(ids, id.String())
	}
	a.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	rows, err := a.pool.Query(ctx, a.sql.AwaitDone, ids)
	if err != nil {
		return err
	}
	done, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	if len(done) > 0 {
		a.notified(strings.Join(done, ","))
	}
	return nil
}

// kickAfter is how long a waiter waits for its events before it wakes the
// relays itself: longer than a round woken by the events' own notification
// takes (commit to fanned out is 1–2 ms at p50), so a kick costs the relays
// a round only when that notification was throttled, dropped or missed.
//
// The kick comes at once when Record in this process refused a transaction
// its notification in the last kickAtOnceWithin: the waiter's own may be
// one.
const (
	kickAfter        = 3 * time.Millisecond
	kickAtOnceWithin = 100 * time.Millisecond
)

// kicker wakes the relays on behalf of waiters whose events are not fanned
// out kickAfter after the wait began. Record throttles its notification (one
// transaction per NotifyInterval sends one), and a relay that is not
// re-checking would then find the event only at its next poll. The kick is a
// notification of its own, sent after the host's commit and outside its
// transaction; kicks are coalesced, one in flight per awaiter.
func (a *Awaiter) kicker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.kick:
		}
		if _, err := a.pool.Exec(ctx, a.sql.NotifyEvents); err != nil && ctx.Err() == nil {
			a.config.Logger.DebugContext(ctx, "events: awaiter could not wake the relays", slog.String("err", err.Error()))
		}
	}
}

// Stop stops the awaiter: waits in progress return an error wrapping
// [ErrNotRunning], the listening connection closes, and no goroutine of the
// awaiter is left when Stop returns. If ctx ends first, Stop still waits for
// the goroutines (which are already cancelled) and returns ctx's error, as
// [Relay.Stop] does. Safe before Start and safe twice.
func (a *Awaiter) Stop(ctx context.Context) error { return a.svc.Stop(ctx) }

// Ready returns a channel that is closed once the awaiter of the current run
// listens. Waits work before that too (they read the rows), but a
// notification sent earlier is not seen; tests and readiness probes wait on
// it. Before the first Start it returns a channel that is never closed.
func (a *Awaiter) Ready() <-chan struct{} { return a.svc.Ready() }

// Stopped returns a channel that is closed once the current run of the
// awaiter has stopped (by Stop, or because Start's context ended) and its
// goroutines have returned. Before the first Start it returns a closed
// channel.
func (a *Awaiter) Stopped() <-chan struct{} { return a.svc.Stopped() }

// AwaitFanout blocks until every event in ids has been fanned out, by any
// relay in any process, and returns their receipts in the order of ids. It
// returns early with an error:
//
//   - a [*PoisonedError] (matching [ErrPoisoned]), with the event ID and its
//     last error, when an event is poisoned as a whole (it could not be
//     fanned out at all; a subscriber whose Map fails does not do that: see
//     [Receipt.Owed] and [Receipt.Poisoned]);
//   - wrapping [ErrNotFound] when an ID is still not visible after
//     [AwaiterConfig.NotFoundGrace] (its transaction rolled back, or never
//     committed);
//   - ctx's error when ctx ends first.
//
// While the database is unreachable (a restart, a lost connection) it keeps
// waiting and reads again, with backoff, until ctx ends.
//
// An event fanned out before the call is reported at once. A receipt means
// the River jobs it names exist (committed), not that they have run. It is
// read when the event's round committed: the subscribers still owed then
// (their Map failed, or no relay that knows them has served them yet) are in
// [Receipt.Owed], the poisoned ones in [Receipt.Poisoned].
func (a *Awaiter) AwaitFanout(ctx context.Context, ids ...uuid.UUID) ([]Receipt, error) {
	return a.awaitMeasured(ctx, ids, "")
}

// AwaitDelivery is [Awaiter.AwaitFanout] for one subscriber: it blocks until
// every event in ids has been fanned out and, if the event is owed to
// subscriber (its Map failed and is being retried, it is paused, or the
// stamping relay did not know it), until a relay delivered it. A receipt
// then names the subscriber's job in Fanout, or none when the subscriber
// does not take the event (its types do not match, or its Map skipped it).
// A delivery poisoned for subscriber returns a [*PoisonedError] naming it; the
// other errors are AwaitFanout's. A subscriber that no running relay has
// waits until ctx ends: give ctx a deadline.
func (a *Awaiter) AwaitDelivery(ctx context.Context, subscriber string, ids ...uuid.UUID) ([]Receipt, error) {
	return a.awaitMeasured(ctx, ids, subscriber)
}

// awaitMeasured is await, counted and timed by outcome.
func (a *Awaiter) awaitMeasured(ctx context.Context, ids []uuid.UUID, subscriber string) (receipts []Receipt, err error) {
	if len(ids) == 0 {
		return nil, nil
	}
	start := time.Now()
	defer func() {
		if a.metrics.receipts == nil {
			return // a zero Awaiter, never made by NewAwaiter
		}
		o := outcome(err)
		a.metrics.receipts.Add(ctx, 1, o)
		a.metrics.duration.Record(ctx, time.Since(start).Seconds(), o)
	}()
	return a.await(ctx, ids, subscriber)
}

// await waits for ids' receipts; with subscriber set, until each is
// delivered to that subscriber too.
func (a *Awaiter) await(ctx context.Context, ids []uuid.UUID, subscriber string) ([]Receipt, error) {
	w := &waiter{wake: wake.New()}
	stopping, err := a.register(w, ids)
	if err != nil {
		return nil, err
	}
	defer a.unregister(w, ids)

	receipts := make(map[uuid.UUID]Receipt, len(ids))
	pending := append([]uuid.UUID(nil), ids...)
	grace := time.NewTimer(a.config.NotFoundGrace)
	defer grace.Stop()
	graceOver := false
	var kick <-chan time.Time // armed at the first look that misses
	for {
		// Registered first, then checked: a fan-out that lands in between
		// is seen here or wakes us.
		missing, err := a.checkUntilAnswered(ctx, pending, receipts, subscriber)
		if err != nil {
			return nil, err
		}
		if len(missing) > 0 && graceOver {
			return nil, fmt.Errorf("%w: %s (not visible after %v)", ErrNotFound, missing[0], a.config.NotFoundGrace)
		}
		pending = pending[:0]
		for _, id := range ids {
			if _, ok := receipts[id]; !ok {
				pending = append(pending, id)
			}
		}
		if len(pending) == 0 {
			out := make([]Receipt, len(ids))
			for i, id := range ids {
				out[i] = receipts[id]
			}
			return out, nil
		}
		if kick == nil {
			after := a.kickAfter
			if notifylimit.For(a.config.Outbox.Schema).RefusedWithin(a.kickAtOnceWithin) {
				after = 0 // a transaction of this process did not notify
			}
			t := time.NewTimer(after)
			defer t.Stop()
			kick = t.C
		}
		select {
		case <-kick:
			a.kick.Send()
		case <-w.wake:
		case <-stopping:
			return nil, fmt.Errorf("%w: the awaiter stopped", ErrNotRunning)
		case <-grace.C:
			graceOver = true
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// checkUntilAnswered is check, tried again with backoff while the database
// is away (restarting, connection lost), until ctx ends.
func (a *Awaiter) checkUntilAnswered(ctx context.Context, pending []uuid.UUID, receipts map[uuid.UUID]Receipt, subscriber string) ([]uuid.UUID, error) {
	for failures := 1; ; failures++ {
		missing, err := a.check(ctx, pending, receipts, subscriber)
		if err == nil || !engine.IsTransient(err) || ctx.Err() != nil {
			return missing, err
		}
		a.config.Logger.WarnContext(ctx, "events: await fanout: reading events failed; retrying", slog.String("err", err.Error()))
		if err := backoff.Sleep(ctx, backoff.Delay(failures, 50*time.Millisecond, time.Second)); err != nil {
			return nil, err
		}
	}
}

// check reads the pending events, fills receipts for the fanned-out ones
// (with subscriber set, only once they owe it nothing), and returns the IDs
// it could not see.
func (a *Awaiter) check(ctx context.Context, pending []uuid.UUID, receipts map[uuid.UUID]Receipt, subscriber string) ([]uuid.UUID, error) {
	ids := make([]string, len(pending))
	for i, id := range pending {
		ids[i] = id.String()
	}
	rows, err := a.pool.Query(ctx, a.sql.Await, ids)
	if err != nil {
		return nil, fmt.Errorf("events: await fanout: %w", err)
	}
	defer rows.Close()
	seen := make(map[uuid.UUID]bool, len(pending))
	var poisonErr error
	for rows.Next() {
		row, err := scanAwaitRow(rows)
		if err != nil {
			return nil, fmt.Errorf("events: await fanout: %w", err)
		}
		seen[row.EventID] = true
		if err := row.answer(subscriber, receipts); err != nil && poisonErr == nil {
			poisonErr = err
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("events: await fanout: %w", err)
	}
	if poisonErr != nil {
		return nil, poisonErr
	}
	var missing []uuid.UUID
	for _, id := range pending {
		if !seen[id] {
			missing = append(missing, id)
		}
	}
	return missing, nil
}

// awaitRow is an event as the Await statement reads it: its receipt so far
// (Owed and Poisoned filled), and whether it is fanned out or poisoned as a
// whole.
type awaitRow struct {
	Receipt
	fannedAt  *time.Time
	poisoned  bool
	lastError string
}

func scanAwaitRow(rows pgx.Rows) (awaitRow, error) {
	var (
		r     awaitRow
		pairs map[string]*string // owed pairs: nil, or the poisoned one's last error
	)
	if err := rows.Scan(&r.EventID, &r.fannedAt, &r.Fanout, &r.poisoned, &r.lastError, &pairs); err != nil {
		return r, err
	}
	for sub, e := range pairs {
		if e == nil {
			r.Owed = append(r.Owed, sub)
			continue
		}
		if r.Poisoned == nil {
			r.Poisoned = map[string]string{}
		}
		r.Poisoned[sub] = *e
	}
	slices.Sort(r.Owed)
	return r, nil
}

// answer files r's receipt in receipts once it answers the wait: the event
// is fanned out and, with subscriber set, owes it nothing. It returns a
// [*PoisonedError] for an event poisoned as a whole, or for subscriber's
// poisoned delivery of it.
func (r awaitRow) answer(subscriber string, receipts map[uuid.UUID]Receipt) error {
	switch {
	case r.fannedAt != nil && subscriber != "" && r.Poisoned[subscriber] != "":
		return &PoisonedError{EventID: r.EventID, Subscriber: subscriber, LastError: r.Poisoned[subscriber]}
	case r.fannedAt != nil && subscriber != "" && (slices.Contains(r.Owed, subscriber) || hasKey(r.Poisoned, subscriber)):
		// Still owed to it: wait for the deliveries lane.
	case r.fannedAt != nil:
		receipt := r.Receipt
		receipt.FannedOutAt = *r.fannedAt
		receipts[r.EventID] = receipt
	case r.poisoned:
		return &PoisonedError{EventID: r.EventID, LastError: r.lastError}
	}
	return nil
}

// register adds w as the waiter of ids, and returns the channel that is
// closed when the run it waits on stops.
func (a *Awaiter) register(w *waiter, ids []uuid.UUID) (stopping <-chan struct{}, err error) {
	run := a.svc.Current()
	if run == nil || run.IsStopping() {
		return nil, fmt.Errorf("%w: call Awaiter.Start first", ErrNotRunning)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, id := range ids {
		ws := a.waiters[id]
		if ws == nil {
			ws = map[*waiter]struct{}{}
			a.waiters[id] = ws
		}
		ws[w] = struct{}{}
	}
	return run.Stopping(), nil
}

func (a *Awaiter) unregister(w *waiter, ids []uuid.UUID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, id := range ids {
		if ws := a.waiters[id]; ws != nil {
			delete(ws, w)
			if len(ws) == 0 {
				delete(a.waiters, id)
			}
		}
	}
}

// notified wakes the waiters of the IDs in a payload of the fanned channel.
func (a *Awaiter) notified(payload string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range strings.Split(payload, ",") {
		id, err := uuid.Parse(s)
		if err != nil {
			continue
		}
		for w := range a.waiters[id] {
			w.wake.Send()
		}
	}
}

func (a *Awaiter) pokeAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, ws := range a.waiters {
		for w := range ws {
			w.wake.Send()
		}
	}
}

// waiting counts the IDs with a waiter, for tests.
func (a *Awaiter) waiting() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.waiters)
}

func hasKey(m map[string]string, k string) bool {
	_, ok := m[k]
	return ok
}
