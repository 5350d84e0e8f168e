// Package owedfloor keeps where a relay's claims of owed deliveries start,
// one floor per subscriber, so that a claim does not walk what earlier
// rounds served.
//
// A round of the deliveries lane deletes every pair it serves. While some
// transaction holds an old snapshot (a report, pg_dump, a standby with
// hot_standby_feedback), VACUUM may not remove those rows, nor their
// entries in the claim index (subscriber, next_attempt_at, event_seq), and
// a claim that read each subscriber's range from its start would step over
// every pair served since the snapshot was taken, round after round: a
// drain's cost would grow with the square of its size, and every idle pass
// after it would pay for all of it.
//
// A subscriber's claims start at its floor, a position (due time, event
// seq) in its range: the last pair a committed round claimed, or, for a pair
// due within Slack of the database clock at that claim, that clock less
// Slack at seq 0. A pair due before the floor can still be written: by a
// transaction that began before it and commits after (its now() is its
// start), or one a claim skipped because another round held it locked.
// Slack covers the transactions that write pairs in the relays' rounds and
// operators' statements, which take milliseconds; the rest are found by a
// look: a claim from the start of every range, once every LookEvery. A pair
// due before the floor waits for at most that; a claim's cost is its batch
// plus the pairs served within Slack before it, whatever was served before.
package owedfloor

import (
	"sync"
	"time"
)

// Defaults.
const (
	// Slack is how far behind the database clock at a claim a floor stays
	// for the pairs that fell due just before it.
	Slack = time.Second
	// LookEvery is how often a claim starts at the start of every range.
	LookEvery = time.Second
)

// Position is a place in a subscriber's range of the claim index. The zero
// Position is before every pair.
type Position struct {
	Due time.Time
	Seq int64
}

// isStart reports whether p is the zero Position, before every pair.
func (p Position) isStart() bool { return p.Due.IsZero() && p.Seq == 0 }

// After reports whether p is past q.
func (p Position) After(q Position) bool {
	return p.Due.After(q.Due) || p.Due.Equal(q.Due) && p.Seq > q.Seq
}

// Seen is the floor that a committed claim of the pair (due, seq), made when
// the database clock read now, allows: the pair itself, or now less slack at
// seq 0 when the pair fell due later than that.
func Seen(due time.Time, seq int64, now time.Time, slack time.Duration) Position {
	if horizon := now.Add(-slack); due.After(horizon) {
		return Position{Due: horizon}
	}
	return Position{Due: due, Seq: seq}
}

// Floors are a relay's floors, safe for its loops to share. The zero value
// uses the defaults and starts with a look.
type Floors struct {
	// LookEvery overrides the default (tests).
	LookEvery time.Duration

	mu     sync.Mutex
	floors map[string]Position
	lookAt time.Time
}

// Next returns where a claim of names' pairs starts, made at now (the
// relay's clock), aligned with names: each one's floor, or the zero
// Position for all when a look is due (look reports it).
func (f *Floors) Next(names []string, now time.Time) (from []Position, look bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	from = make([]Position, len(names))
	if !now.Before(f.lookAt) {
		every := f.LookEvery
		if every <= 0 {
			every = LookEvery
		}
		f.lookAt = now.Add(every)
		return from, true
	}
	for i, name := range names {
		from[i] = f.floors[name]
	}
	return from, false
}

// Peek returns names' floors, aligned with names, without taking a look:
// for a statement that reads where claims would start (the idle poll).
func (f *Floors) Peek(names []string) []Position {
	f.mu.Lock()
	defer f.mu.Unlock()
	from := make([]Position, len(names))
	for i, name := range names {
		from[i] = f.floors[name]
	}
	return from
}

// Observe moves name's floor to p once a round whose claim started at from
// and reached p has committed. A claim from the start (from is the zero
// Position: a look, or the run's first claims) sets it, lower too: pairs it
// found below the floor (a long transaction's, committed late) are served
// from there on, a batch a round, not a batch a look. A claim from a floor
// only raises it, and only from a floor it started at or below: the pairs a
// round claimed below another round's floor were served by it, and a claim
// that started above a floor a look has lowered since did not read what
// lies between.
func (f *Floors) Observe(name string, from, p Position) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.floors == nil {
		f.floors = map[string]Position{}
	}
	cur := f.floors[name]
	if from.isStart() || !from.After(cur) && p.After(cur) {
		f.floors[name] = p
	}
}

// Reset drops every floor and makes the next claim a look: the database
// restarted or was away, and a crash may have lost the asynchronous commits
// of rounds that moved the floors (their pairs are owed again, below them).
func (f *Floors) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.floors, f.lookAt = nil, time.Time{}
}
