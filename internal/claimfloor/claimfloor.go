// Package claimfloor decides where a relay's next claim of pending events
// starts, so that a claim does not step over the dead index entries of every
// event fanned out since the oldest snapshot (a held snapshot keeps VACUUM
// from removing them).
//
// Each event row carries the ID of the (top-level) transaction that recorded
// it. The floor is a set of transaction IDs outside which the relay has seen
// every committed pending row: the transactions that were still running at
// its last claim that came back short of its batch (the snapshot's xip list,
// read before the claim), and every one from that snapshot's xmax on. Every
// other transaction had ended by then, so all its rows were visible to the
// claim, and it took every one it could. A transaction still running then is
// in the set, so whenever it commits, however late, its rows are claimed: a
// floor is not a cursor that a late commit can slip under.
//
// The set is a floor proper (From: every transaction from there on) and the
// running transactions below it (Running), so that one transaction left open
// for an hour — a console's forgotten BEGIN after an UPDATE, a long batch job,
// in any database of the server — costs the claims one index probe, not a
// walk over the dead entries of every event fanned out since it began (which
// it keeps VACUUM from removing, as a held snapshot does). At most
// MaxRunning are kept; beyond them the floor proper comes down to the next
// one, which claims more than needed, never less.
//
// The floor proper is a position, (transaction, seq): a claim that filled
// its batch took every row it could of its last row's transaction up to
// that row, and the next starts after it, not at the transaction's first
// row. One transaction that records a backlog of 100,000 events is drained
// in batches that each start where the last ended; from the transaction's
// first row, each would step over the entries of all the rows stamped
// before it, which a held snapshot keeps from being marked dead.
//
// What a floor claim cannot see is a row below the floor that is pending
// again: one it skipped because another round held it locked (SKIP LOCKED)
// and that round then rolled back, or one whose round's commit a server
// crash lost (rounds commit with synchronous_commit off). Looks below the
// floor, on a goroutine of their own so that no claim walks what they
// walk, find such rows and lower the floor to them:
//
//   - every two seconds, from the floor the relay had five seconds ago (a
//     round that held the row then has ended since, unless it ran longer);
//   - every minute, at the relay's start and soon after it reconnects to the
//     database, from the start.
//
// A look that finds a row lowers the floor to it: the claims that follow
// take it, and the floor rises again with them.
//
// A Floor is safe for concurrent use by the relay's loops.
package claimfloor

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Schedule is the looks' schedule; a zero field takes its default.
type Schedule struct {
	RescanEvery time.Duration // the settled look's, default 2 s
	SettleAfter time.Duration // default 5 s
	FullEvery   time.Duration // the look from the start's, default 1 min
}

func (s Schedule) rescanEvery() time.Duration { return cmp.Or(s.RescanEvery, 2*time.Second) }
func (s Schedule) settleAfter() time.Duration { return cmp.Or(s.SettleAfter, 5*time.Second) }
func (s Schedule) fullEvery() time.Duration   { return cmp.Or(s.FullEvery, time.Minute) }

// Kind is how a claim reads the pending events.
type Kind int

const (
	// Full claims from the start, in seq order (ClaimBatch): a run's first
	// claim, without a floor to start from.
	Full Kind = iota
	// From claims from a floor, in (xid, seq) order: ClaimFrom.
	From
)

// MaxRunning is how many running transactions below the floor proper a floor
// keeps (see the package's documentation).
const MaxRunning = 32

// Claim is where one claim starts.
type Claim struct {
	Kind Kind
	// From and FromSeq are the floor proper, for Kind From: the claim reads
	// the rows of transaction From whose seq is above FromSeq (0: all of
	// them), and those of every younger transaction.
	From, FromSeq int64
	// Running are the transactions below From that the claim reads too,
	// ascending (nil: none).
	Running []int64
}

// Position is a row's place in the floor's order: its transaction, then its
// seq.
type Position struct {
	Xid, Seq int64
}

func (p Position) less(q Position) bool {
	return p.Xid < q.Xid || p.Xid == q.Xid && p.Seq < q.Seq
}

func maxPos(ps ...Position) Position {
	m := ps[0]
	for _, p := range ps[1:] {
		if m.less(p) {
			m = p
		}
	}
	return m
}

func (c Claim) proper() Position { return Position{c.From, c.FromSeq} }

// low is the lowest transaction the claim reads.
func (c Claim) low() int64 {
	if len(c.Running) > 0 {
		return c.Running[0]
	}
	return c.From
}

// has reports whether the claim reads any of transaction x's rows.
func (c Claim) has(x int64) bool {
	if x >= c.From {
		return true
	}
	_, found := slices.BinarySearch(c.Running, x)
	return found
}

// hasAll reports whether the claim reads all of transaction x's rows.
func (c Claim) hasAll(x int64) bool {
	return c.has(x) && (x != c.From || c.FromSeq == 0)
}

// Snapshot is a snapshot of the server's running transactions
// (pg_current_snapshot()), read before a claim or a look.
type Snapshot struct {
	Xmin, Xmax int64
	Running    []int64 // xip: ascending, from Xmin up to Xmax
}

// ParseSnapshot parses a snapshot's text form, xmin:xmax:xip,xip,...
func ParseSnapshot(s string) (Snapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return Snapshot{}, fmt.Errorf("claimfloor: snapshot %q: want xmin:xmax:xip", s)
	}
	var (
		snap Snapshot
		err  error
	)
	if snap.Xmin, err = strconv.ParseInt(parts[0], 10, 64); err != nil {
		return Snapshot{}, fmt.Errorf("claimfloor: snapshot %q: xmin: %w", s, err)
	}
	if snap.Xmax, err = strconv.ParseInt(parts[1], 10, 64); err != nil {
		return Snapshot{}, fmt.Errorf("claimfloor: snapshot %q: xmax: %w", s, err)
	}
	if parts[2] != "" {
		for x := range strings.SplitSeq(parts[2], ",") {
			v, err := strconv.ParseInt(x, 10, 64)
			if err != nil {
				return Snapshot{}, fmt.Errorf("claimfloor: snapshot %q: xip: %w", s, err)
			}
			snap.Running = append(snap.Running, v)
		}
		slices.Sort(snap.Running)
	}
	return snap, nil
}

// At is a snapshot with no transaction running: xmin and xmax both xid.
func At(xid int64) Snapshot { return Snapshot{Xmin: xid, Xmax: xid} }

type mark struct {
	at    time.Time
	floor Claim // the floor then
}

// Floor is one relay's claim floor. The zero value is ready: it has no floor
// yet: its first claim is from the start, and the next ones from transaction
// 0 in the floor's order, until one comes back short (or a full one moves
// the floor to its last row's transaction).
type Floor struct {
	Schedule Schedule

	mu      sync.Mutex
	floor   int64   // the floor proper's transaction; 0: no claim has moved it yet
	seq     int64   // and the seq its rows start after (0: all of them)
	running []int64 // the running transactions below it, ascending
	marks   []mark
	started bool
	fullAt  time.Time // when the look from the start is due
	lookAt  time.Time // when the settled look is due
}

// Start gives a floor that has not claimed yet a floor to start from:
// another relay's (the highest of the relays' last ones), under which every
// row was claimed by then, at now. Its first claim is from there, and its
// look from the start, SettleAfter later, finds any row left below (a
// round that a crashed process held): first the backlog that waited for a
// deploy's new process, then the look, which under a held snapshot walks
// every dead entry. A floor of 0 is none: the first claim is from the start.
func (f *Floor) Start(floor int64, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.started || floor <= 0 {
		return
	}
	f.floor, f.seq, f.running, f.started = floor, 0, nil, true
	f.fullAt = now.Add(f.Schedule.settleAfter())
}

// Stored is the floor to write for other relays to start from (nil: none):
// its lowest transaction, since a floor written is one number.
func (f *Floor) Stored() *int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.floor == 0 {
		return nil
	}
	v := f.low()
	return &v
}

// Current is the floor's lowest transaction (0: none yet; the next claim is
// from the start): no transaction below it is running.
func (f *Floor) Current() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.low()
}

func (f *Floor) low() int64 {
	return f.claim().low()
}

func (f *Floor) claim() Claim {
	return Claim{Kind: From, From: f.floor, FromSeq: f.seq, Running: f.running}
}

// Next returns where the next claim starts.
func (f *Floor) Next() Claim {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.peek()
	f.started = true
	return c
}

// Look returns where an idle relay's look for pending rows starts: where the
// next claim would.
func (f *Floor) Look() Claim {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.peek()
}

func (f *Floor) peek() Claim {
	if !f.started {
		return Claim{Kind: Full}
	}
	return f.claim() // running is never written in place: the claim may keep it
}

// Below is a look below the floor: for pending rows whose transaction is
// at least From and below Below (or Below's own, up to seq BelowSeq), or
// one of Dropped, but not one of Skip (the running transactions, which the
// claims read).
type Below struct {
	From, Below int64
	BelowSeq    int64
	Dropped     []int64
	Skip        []int64
}

// LookBelow returns the look below the floor due at now, if one is, and
// takes it off the schedule: the look from the start if due, else the
// settled look: over what the floor read SettleAfter ago and reads no
// longer (from the floor proper then, and the running transactions then
// that it dropped since; none while the floor is younger, or has not moved
// since). Without a floor, claims start from 0 and there is nothing below.
func (f *Floor) LookBelow(now time.Time) (Below, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if now.Before(f.lookAt) && now.Before(f.fullAt) {
		return Below{}, false
	}
	f.lookAt = now.Add(f.Schedule.rescanEvery())
	full := !now.Before(f.fullAt)
	if full {
		f.fullAt = now.Add(f.Schedule.fullEvery())
	}
	switch {
	case f.floor == 0:
		return Below{}, false
	case full:
		return Below{From: 0, Below: f.floor, BelowSeq: f.seq, Skip: f.running}, true
	}
	then, ok := f.settledClaim(now)
	if !ok {
		return Below{}, false
	}
	cur := f.claim()
	var dropped []int64
	for _, x := range then.Running {
		if !cur.hasAll(x) {
			dropped = append(dropped, x)
		}
	}
	if !then.proper().less(cur.proper()) && len(dropped) == 0 {
		return Below{}, false // the floor reads all it read then
	}
	return Below{From: min(then.From, cur.From), Below: f.floor, BelowSeq: f.seq, Dropped: dropped, Skip: f.running}, true
}

// NextLookIn is how long until a look below is due.
func (f *Floor) NextLookIn(now time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return max(0, min(f.lookAt.Sub(now), f.fullAt.Sub(now)))
}

// LookFailed puts look, which failed, back on the schedule, due at again
// (a look from the start, or the settled look, whichever it was).
func (f *Floor) LookFailed(look Below, again time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if look.From == 0 {
		f.fullAt = minTime(f.fullAt, again)
	}
	f.lookAt = minTime(f.lookAt, again)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// LookSoon makes the look from the start due now: the relay reconnected,
// and a crash may have lost the commits of rounds that moved the floor.
func (f *Floor) LookSoon() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fullAt = time.Time{}
}

// Lower lowers the floor to to, where a look below found a pending row:
// the next claims take it. A claim that began before (from higher up) does
// not move the floor when it ends (see Observe).
func (f *Floor) Lower(to int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.widen(Claim{Kind: From, From: to})
}

// widen makes the floor read every row that c reads too.
func (f *Floor) widen(c Claim) {
	cur := f.claim()
	if cur.covers(c) {
		return
	}
	u := union(cur, c)
	f.floor, f.seq, f.running = u.From, u.FromSeq, u.Running
	for i := range f.marks {
		f.marks[i].floor = union(f.marks[i].floor, c)
	}
}

// covers reports whether c reads every row that d reads.
func (c Claim) covers(d Claim) bool {
	return !d.proper().less(c.proper()) && !slices.ContainsFunc(d.Running, func(x int64) bool { return !c.hasAll(x) })
}

// union is a claim that reads every row that a or b reads (and, beyond
// MaxRunning running transactions, more).
func union(a, b Claim) Claim {
	proper := a.proper()
	if b.proper().less(proper) {
		proper = b.proper()
	}
	var running []int64
	for _, x := range slices.Concat(a.Running, b.Running) {
		switch {
		case x < proper.Xid:
			running = append(running, x)
		case x == proper.Xid:
			proper.Seq = 0 // one reads all of it
		}
	}
	slices.Sort(running)
	running = slices.Compact(running)
	if len(running) > MaxRunning {
		proper, running = Position{Xid: running[MaxRunning]}, running[:MaxRunning:MaxRunning]
	}
	return Claim{Kind: From, From: proper.Xid, FromSeq: proper.Seq, Running: running}
}

// Failed tells the floor that claim c's round did not commit: the rows it
// held are pending again, where it read, perhaps below the floor that other
// rounds have moved meanwhile. The floor goes back there (a failed first
// claim from the start makes the next one from the start too), so the next
// claims take them, not a look seconds later.
func (f *Floor) Failed(c Claim) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c.Kind == Full {
		f.started = false
		return
	}
	f.widen(c)
}

// Settled is the floor's lowest transaction as it was SettleAfter ago; 0
// and false while the floor is younger.
func (f *Floor) Settled(now time.Time) (int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.settledClaim(now)
	return c.low(), ok
}

// settledClaim is the floor as it was SettleAfter ago, which the settled
// look starts from; false while the floor is younger.
func (f *Floor) settledClaim(now time.Time) (Claim, bool) {
	cut := now.Add(-f.Schedule.settleAfter())
	for i := len(f.marks) - 1; i >= 0; i-- {
		if !f.marks[i].at.After(cut) {
			return f.marks[i].floor, true
		}
	}
	return Claim{}, false
}

// Check tells the floor the oldest transaction running (xmin) at a look
// that began when the floor was look (Look, read before). Every transaction
// running then or since is in the floor, so xmin is outside it only if
// transaction IDs went back (see Observe): the floor starts again from 0
// and Check reports true, since events may wait outside the old floor where
// no claim or look from it sees them.
func (f *Floor) Check(look Claim, xmin int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if look.Kind != From || look.has(xmin) || f.floor == 0 {
		return false
	}
	f.floor, f.seq, f.running, f.marks = 0, 0, nil, nil
	return true
}

// Observe moves the floor after claim c's round committed. s is the snapshot
// read before the claim looked; claimed how many rows it took, of a batch of
// size; last the last of them in (transaction, seq) order (a From claim's
// rows are in that order).
//
// A short claim saw every committed row of every transaction it reads that
// had ended at s: the floor keeps the ones still running (s.Running) and
// those from s.Xmax on. A full From claim left rows from its last one's
// transaction on, and those of transactions running at its own snapshot,
// which are in s.Running or from s.Xmax on: the floor keeps those. Of the
// last row's transaction, which had committed, it took every row up to the
// last it could: the floor proper moves past that row. A full
// Full claim, in seq order, may have left rows anywhere: the floor stays.
//
// now is when the round committed: the floor's mark takes that time, so that
// the settled rescan never starts above a floor still in effect SettleAfter
// ago.
func (f *Floor) Observe(c Claim, s Snapshot, claimed, size int, last Position, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c.Kind == From && !c.has(s.Xmin) {
		// Transaction IDs went back: a standby promoted while behind, a
		// crash that lost commits, a restore. (Every floor keeps each
		// transaction that was running when it was read, and every
		// transaction that begins later gets a younger ID than its floor
		// proper, so the oldest running one is in every floor read
		// before.) New events are outside the floor: start again from 0.
		// This claim started at the old floor, so it moves nothing: the
		// next claim is from 0.
		f.floor, f.seq, f.running, f.marks = 0, 0, nil, nil
		return
	}
	cur := f.claim()
	if c.Kind == From && !c.covers(cur) {
		// The floor was lowered (or reset) while this claim ran: it did
		// not read all that the floor now reads, so it moves nothing.
		return
	}
	above := Position{Xid: s.Xmax} // rows the claim may not have seen, from here on
	switch {
	case c.Kind == Full && claimed >= size:
		return
	case c.Kind == Full:
		c = Claim{Kind: From} // it read every transaction
	case claimed >= size && last.Xid < s.Xmax:
		above = last
	}
	// The new floor: what both the current one and this claim's outcome
	// read.
	keep := func(x int64) bool {
		if !cur.has(x) || !c.has(x) {
			return false
		}
		if x >= above.Xid {
			return true
		}
		_, running := slices.BinarySearch(s.Running, x)
		return running
	}
	proper := maxPos(cur.proper(), c.proper(), above)
	var running []int64
	for _, x := range slices.Concat(cur.Running, c.Running, s.Running) {
		if x < proper.Xid && keep(x) {
			running = append(running, x)
		}
	}
	slices.Sort(running)
	running = slices.Compact(running)
	if len(running) > MaxRunning {
		proper, running = Position{Xid: running[MaxRunning]}, running[:MaxRunning:MaxRunning]
	}
	if proper == cur.proper() && slices.Equal(running, cur.Running) {
		return
	}
	f.floor, f.seq, f.running = proper.Xid, proper.Seq, running
	f.marks = append(f.marks, mark{at: now, floor: f.claim()})
	// Keep the newest mark that is SettleAfter old, and every newer one.
	cut := now.Add(-f.Schedule.settleAfter())
	keepFrom := 0
	for i := len(f.marks) - 1; i >= 0; i-- {
		if !f.marks[i].at.After(cut) {
			keepFrom = i
			break
		}
	}
	f.marks = f.marks[keepFrom:]
}
