package engine

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/standmeet/events/internal/owedfloor"
)

// The deliveries lane. A delivery is owed when its
// subscriber's attempt failed (it waits for its retry, or is poisoned), when
// the relay that stamped the event did not know the subscriber (a rolling
// deploy: the stamp writes a delivery for every active registered subscriber it
// lacks whose types match), or when the subscriber was paused. Only owed
// deliveries have a row, in outbox_deliveries; the common path writes none.
//
// A relay claims the due deliveries of the subscribers it knows here, FOR UPDATE
// SKIP LOCKED with their events, inserts their jobs, extends the events'
// fanout and deletes the deliveries, all in one transaction: exactly once per
// delivery. A delivery that fails again is charged and waits for its next attempt;
// after MaxAttempts it is poisoned, for that subscriber alone.
//
// Relays of 0.1.0 still write catch_up lists during a deploy; the lane turns
// them into deliveries first (outbox_convert_catch_up, migration 006).

// convertEvery is how often a relay looks for catch_up lists written by
// relays of 0.1.0, when the last look found none.
const convertEvery = time.Second

// convertBatch is how many events one conversion takes.
const convertBatch = 1000

// owedLockClass is the advisory lock class with which one deliveries round
// at a time serves an ordered subscriber (ClaimOwed).
const owedLockClass = 7365111

// Fresh events flow, and the deliveries lane makes room for them, while the
// rows the pending lane claimed, counted with a decay of time constant
// freshFlowing, reach freshFlowRows: about 20 events a second or more, or a
// burst of three (rows, not rounds: a round slow enough to find three rows
// of a trickle at once counts them as a burst). A trickle does not flow:
// taking a fresh row in the last 100 ms as a flow, ten fresh events a
// second made a 40,000-pair drain 2.45 times as long as alone (it was
// served as beside a flow); a fresh event of a trickle waits for at most
// one full round of the backlog instead.
const (
	freshFlowing  = 100 * time.Millisecond
	freshFlowRows = 2.5
)

// freshMeter counts the rows the pending lane claims, for freshFlowing.
type freshMeter struct {
	mu   sync.Mutex
	rows float64   // rows claimed, decayed to at
	at   time.Time // when a pending round last claimed rows
}

// claimed counts n rows a pending round claimed at now.
func (m *freshMeter) claimed(now time.Time, n int) {
	if n == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// A caller descheduled between its clock reading and the lock counts
	// as of the latest claim: the meter's clock never goes back.
	if now.Before(m.at) {
		now = m.at
	}
	m.rows = decayed(m.rows, now.Sub(m.at)) + float64(n)
	m.at = now
}

// flowing reports whether fresh events flow at now.
func (m *freshMeter) flowing(now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if now.Sub(m.at) >= 3*freshFlowing {
		return false // decayed below a twentieth: gone, whatever the count
	}
	return decayed(m.rows, now.Sub(m.at)) >= freshFlowRows
}

// last returns when a pending round last claimed rows.
func (m *freshMeter) last() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.at
}

// decayed is rows after d of decay with time constant freshFlowing.
func decayed(rows float64, d time.Duration) float64 {
	if d <= 0 {
		return rows
	}
	return rows * math.Exp(-float64(d)/float64(freshFlowing))
}

// owedRound runs one round of the deliveries lane: at most a batch of due
// deliveries, claimed one subscriber after another in the order of owedOrder.
// It never drains the lane: once a round finds deliveries, the main loop runs
// one after each pending round, and the helper loops (MaxRoundsInFlight > 1)
// join while no fresh events flow, so a backlog drains at full speed when
// it has the relay to itself; while fresh events flow, the main loop alone
// serves it, in short rounds (owedBatch), so a fresh event waits for at
// most one short round of the backlog. A round claims at most batch
// deliveries. It returns the seqs it claimed and whether more may be due.
func (r *Relay) owedRound(ctx context.Context, batch int) (claimed []int64, full bool, err error) {
	if len(r.known) == 0 {
		r.owedBusy.Store(false)
		return nil, false, nil
	}
	names, ordered := r.owedOrder()
	floors, _ := r.owedFloors.Next(names, time.Now()) // or the start of every range: a look
	fromDue, fromSeq := floorArgs(floors)
	claimed, err = r.round(ctx, LaneOwed, r.sql.ClaimOwed, names, int64(batch), ordered, int32(owedLockClass), fromDue, fromSeq)
	// A batch is counted in deliveries, and an event brings every delivery of it
	// that is due: any claim says more may be due. One empty round ends the
	// lane's turn.
	full = err == nil && len(claimed) > 0
	r.owedBusy.Store(full)
	return claimed, full, err
}

// floorArgs is floors as the statements take them: due times and seqs.
func floorArgs(floors []owedfloor.Position) (due []time.Time, seq []int64) {
	due, seq = make([]time.Time, len(floors)), make([]int64, len(floors))
	for i, p := range floors {
		due[i], seq[i] = p.Due, p.Seq
	}
	return due, seq
}

// observeOwed moves the claim floors of the subscribers whose pairs a
// committed round of the deliveries lane claimed (package owedfloor) to the
// last pair it claimed of each. The claim started at names' floors (due
// times dues, seqs seqs). Only to what it claimed: pairs it stepped over
// (SKIP LOCKED: another round held them, or their events) are below, for
// that round or the next look.
func (r *Relay) observeOwed(batch []claimedRow, names []string, dues []time.Time, seqs []int64) {
	last := map[string]owedfloor.Position{}
	for _, c := range batch {
		for _, p := range c.owed {
			if s := owedfloor.Seen(p.due, c.Seq, p.now, owedfloor.Slack); s.After(last[p.sub]) {
				last[p.sub] = s
			}
		}
	}
	for i, name := range names {
		if p, ok := last[name]; ok {
			r.owedFloors.Observe(name, owedfloor.Position{Due: dues[i], Seq: seqs[i]}, p)
		}
	}
}

// owedOrder returns the relay's subscribers, and whether each is ordered,
// rotated by one each call: the deliveries lane's claim serves them in this
// order, so a subscriber with a large backlog does not take every round
// from another's.
func (r *Relay) owedOrder() (names []string, ordered []bool) {
	n := len(r.known)
	k := 0
	if n > 1 {
		k = int(r.owedTurn.Add(1) % uint64(n))
	}
	names, ordered = make([]string, 0, n), make([]bool, 0, n)
	for i := range n {
		s := r.active[(k+i)%n]
		names, ordered = append(names, s.Name), append(ordered, s.Ordered)
	}
	return names, ordered
}

// owedShare is the part of a batch that a round of the deliveries lane
// claims while fresh events flow (freshFlowing): an eighth. The main loop
// alone serves the backlog then, one such round after each pending round,
// so a fresh event waits for at most one short round of the backlog, and
// the relay's backlog keeps one server backend busy, not one per round in
// flight (another relay whose own fresh events do not flow serves it in
// full rounds, helpers joining). While fresh events flow, the drain no
// longer grows with MaxRoundsInFlight: a backlog gets an eighth of the
// main loop's batches. Measured with
// eventsbench's backlog section on two cores (docs/benchmarks.md, "One loop
// serves a backlog while fresh events flow"): a 40,000-pair drain with
// fresh events at 200/s took 6–8 s, against 15–22 s with the helper loops
// draining it in quarter batches and resting twice as long as each round
// took, for the same fresh p99; in quarter batches on the main loop alone
// the p99 doubled.
const owedShare = 8

// owedBatch is how many deliveries a round of the main loop's deliveries
// lane claims: a batch, or an eighth of one while fresh events flow
// (owedShare).
func (r *Relay) owedBatch() int {
	if r.freshFlowing() {
		return max(1, r.config.BatchSize/owedShare)
	}
	return r.config.BatchSize
}

// freshFlowing reports whether fresh events flow (freshMeter).
func (r *Relay) freshFlowing() bool { return r.fresh.flowing(time.Now()) }

// owedPass is the main loop's turn of the deliveries lane: the catch_up
// lists of 0.1.0 relays converted (at most once a second while there are
// none), then one round. On a failed round it backs off with fail (which
// reports whether to go on) and retries the claimed deliveries' events one by
// one. It reports whether the round was full and whether the loop should go
// on.
func (r *Relay) owedPass(ctx context.Context, fail func(context.Context, error) bool) (full, ok bool) {
	if len(r.known) == 0 {
		return false, true
	}
	if err := r.convertCatchUp(ctx); err != nil {
		return false, fail(ctx, err)
	}
	batch := r.owedBatch()
	if r.Hooks.OwedRound != nil {
		r.Hooks.OwedRound(false, batch)
	}
	claimed, full, err := r.owedRound(ctx, batch)
	if r.Hooks.MainRound != nil && err == nil {
		r.Hooks.MainRound(LaneOwed, len(claimed))
	}
	if err != nil {
		if !fail(ctx, err) {
			return false, false
		}
		r.rowByRow(ctx, LaneOwed, claimed, err)
		return true, true
	}
	return full, true
}

// convertCatchUp turns catch_up lists of relays of 0.1.0 into owed deliveries:
// at most once per convertEvery while there are none.
func (r *Relay) convertCatchUp(ctx context.Context) error {
	if time.Now().Before(r.convertAt) {
		return nil
	}
	for !r.stopping() && ctx.Err() == nil {
		var n int64
		if err := r.pool.QueryRow(ctx, r.sql.ConvertCatchUp, convertBatch).Scan(&n); err != nil {
			return err
		}
		if n < convertBatch {
			break
		}
	}
	r.convertAt = time.Now().Add(convertEvery)
	return nil
}
