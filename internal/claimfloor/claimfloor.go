// Package claimfloor decides where a relay's next claim of pending events
// starts, so that a claim does not step over the dead index entries of every
// event fanned out since the oldest snapshot (a held snapshot keeps VACUUM
// from removing them).
//
// Each event row carries the ID of the (top-level) transaction that recorded
// it. The floor is a transaction ID below which the relay has seen every
// committed pending row: at a claim that came back short of its batch, every
// transaction older than the oldest one then running (the snapshot's xmin,
// read before the claim) had ended, so all their rows were visible to the
// claim, and it took every one it could. A transaction still running then has
// an ID at or above that xmin, so whenever it commits, however late, its rows
// are above the floor: a floor is not a cursor that a late commit can slip
// under.
//
// What a floor claim cannot see is a row it skipped because another round
// held it locked (SKIP LOCKED) and that round then rolled back: the row is
// pending again, below the floor. Two rescans find such rows:
//
//   - every two seconds, a claim from the floor the relay had five seconds
//     ago (a round that held the row then has ended since, unless it ran
//     longer; while the floor is younger than that, from 0);
//   - every minute, a claim from the start, in seq order: rows of rounds
//     that ran longer, and rows recorded before the column existed (NULL).
//
// An idle relay looks for pending rows where its next claim would start, and
// a rescan that finds nothing is done (see Look).
//
// A Floor is safe for concurrent use by the relay's loops.
package claimfloor

import (
	"cmp"
	"sync"
	"time"
)

// Schedule is the rescans' schedule; a zero field takes its default.
type Schedule struct {
	RescanEvery time.Duration // default 2 s
	SettleAfter time.Duration // default 5 s
	FullEvery   time.Duration // default 1 min
}

func (s Schedule) rescanEvery() time.Duration { return cmp.Or(s.RescanEvery, 2*time.Second) }
func (s Schedule) settleAfter() time.Duration { return cmp.Or(s.SettleAfter, 5*time.Second) }
func (s Schedule) fullEvery() time.Duration   { return cmp.Or(s.FullEvery, time.Minute) }

// Kind is how a claim reads the pending events.
type Kind int

const (
	// Full claims from the start, in seq order: ClaimBatch.
	Full Kind = iota
	// From claims from a floor, in (xid, seq) order: ClaimFrom.
	From
)

// Claim is where one claim starts.
type Claim struct {
	Kind Kind
	From int64 // the floor, for Kind From
}

type mark struct {
	at    time.Time
	floor int64
}

// Floor is one relay's claim floor. The zero value is ready: it has no floor
// yet: its first claim is from the start, and the next ones from transaction
// 0 in the floor's order, until one comes back short (or a full one moves
// the floor to its last row's transaction).
type Floor struct {
	Schedule Schedule

	mu       sync.Mutex
	floor    int64 // 0: no claim has moved it yet
	marks    []mark
	fullAt   time.Time
	rescanAt time.Time
}

// Current is the floor (0: none yet; the next claim is from the start).
func (f *Floor) Current() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.floor
}

// Next returns where the next claim starts, and takes the rescan it is (if
// it is one) off the schedule; a claim that fails takes its rescan again
// only at the next due time.
func (f *Floor) Next(now time.Time) Claim {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, full, rescan := f.peek(now)
	f.done(now, full, rescan)
	return c
}

// Look returns where an idle relay's look for pending rows starts: where the
// next claim would. Looked says whether it found any.
func (f *Floor) Look(now time.Time) Claim {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, _, _ := f.peek(now)
	return c
}

// Looked tells the floor what a look at now found: if nothing, a rescan it
// was is done (an idle relay does not rescan what it has just looked at); if
// something, the next claim is the rescan.
func (f *Floor) Looked(now time.Time, found bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if found {
		return
	}
	_, full, rescan := f.peek(now)
	f.done(now, full, rescan)
}

func (f *Floor) peek(now time.Time) (c Claim, full, rescan bool) {
	if !now.Before(f.fullAt) {
		return Claim{Kind: Full}, true, false
	}
	if !now.Before(f.rescanAt) {
		// Younger than SettleAfter, the settled floor is 0: what the
		// first claims skipped.
		settled, _ := f.settled(now)
		return Claim{Kind: From, From: settled}, false, true
	}
	return Claim{Kind: From, From: f.floor}, false, false
}

func (f *Floor) done(now time.Time, full, rescan bool) {
	if full {
		f.fullAt = now.Add(f.Schedule.fullEvery())
	}
	if full || rescan {
		f.rescanAt = now.Add(f.Schedule.rescanEvery())
	}
}

// Settled is the floor as it was SettleAfter ago, which the settled rescan
// starts from; 0 and false while the floor is younger.
func (f *Floor) Settled(now time.Time) (int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.settled(now)
}

func (f *Floor) settled(now time.Time) (int64, bool) {
	cut := now.Add(-f.Schedule.settleAfter())
	for i := len(f.marks) - 1; i >= 0; i-- {
		if !f.marks[i].at.After(cut) {
			return f.marks[i].floor, true
		}
	}
	return 0, false
}

// Check tells the floor the oldest transaction running (xmin) at a look
// that began when the floor was floor (Current, read before the look). A
// look is later than the claim that set that floor, so its xmin is lower
// only if transaction IDs went back (see Observe): the floor starts again
// from 0 and Check reports true, since events may wait below the old floor
// where no look from it sees them.
func (f *Floor) Check(floor, xmin int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if xmin >= floor || f.floor == 0 {
		return false
	}
	f.floor, f.marks = 0, nil
	return true
}

// Observe moves the floor after claim c's round committed. xmin is the
// oldest transaction running before the claim looked; claimed how many rows
// it took, of a batch of size; maxXid the largest transaction ID among them
// (a From claim's rows are in (xid, seq) order).
//
// A short claim saw every committed row of every transaction older than
// xmin: the floor moves to xmin. A full From claim left rows above its last
// one: the floor moves to that row's transaction (its other rows may be
// left). A full Full claim, in seq order, may have left rows anywhere: the
// floor stays.
//
// now is when the round committed: the floor's mark takes that time, so that
// the settled rescan never starts above a floor still in effect SettleAfter
// ago.
func (f *Floor) Observe(c Claim, xmin int64, claimed, size int, maxXid int64, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c.Kind == From && xmin < c.From {
		// Transaction IDs went back: a standby promoted while behind, a
		// crash that lost commits, a restore. (Every floor was read
		// before this claim's xmin, and the oldest running transaction
		// only moves up; a round that began before a later one and ends
		// after it reads an older xmin than the floor, but not than its
		// own claim's.) New events are below the floor: start again
		// from 0. This claim started at the old floor, so it moves
		// nothing: the next claim is from 0.
		f.floor, f.marks = 0, nil
		return
	}
	to := xmin
	if claimed >= size {
		if c.Kind == Full {
			return
		}
		to = min(xmin, maxXid)
	}
	if to <= f.floor {
		return
	}
	f.floor = to
	f.marks = append(f.marks, mark{at: now, floor: f.floor})
	// Keep the newest mark that is SettleAfter old, and every newer one.
	cut := now.Add(-f.Schedule.settleAfter())
	keep := 0
	for i := len(f.marks) - 1; i >= 0; i-- {
		if !f.marks[i].at.After(cut) {
			keep = i
			break
		}
	}
	f.marks = f.marks[keep:]
}
