package claimfloor

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func TestTheFirstClaimIsFromTheStart(t *testing.T) {
	var f Floor
	require.Equal(t, Claim{Kind: Full}, f.Next(t0))
	require.Zero(t, f.Current())
	// A full batch in seq order leaves the floor at 0; the next claims are
	// in the floor's order, and a full one of them moves it.
	f.Observe(Claim{Kind: Full}, 500, 10, 10, 0, t0)
	c := f.Next(t0.Add(time.Millisecond))
	require.Equal(t, Claim{Kind: From, From: 0}, c)
	f.Observe(c, 500, 10, 10, 120, t0)
	require.EqualValues(t, 120, f.Current())
}

func TestAShortClaimMovesTheFloorToTheOldestRunningTransaction(t *testing.T) {
	var f Floor
	c := f.Next(t0)
	f.Observe(c, 100, 3, 10, 0, t0)
	require.EqualValues(t, 100, f.Current())
	require.Equal(t, Claim{Kind: From, From: 100}, f.Next(t0.Add(time.Millisecond)))
	// Never back down: a round that began before the one that moved the
	// floor, and ends after it, read an older xmin.
	f.Observe(Claim{Kind: From, From: 80}, 90, 0, 10, 0, t0)
	require.EqualValues(t, 100, f.Current())
}

func TestAFullClaimMovesTheFloorOnlyInTransactionOrder(t *testing.T) {
	var f Floor
	c := f.Next(t0)
	f.Observe(c, 500, 10, 10, 0, t0) // full, in seq order: rows may be left anywhere
	require.Zero(t, f.Current())
	f.Observe(c, 100, 1, 10, 0, t0)
	c = f.Next(t0.Add(time.Millisecond))
	require.Equal(t, Claim{Kind: From, From: 100}, c)
	f.Observe(c, 500, 10, 10, 230, t0) // full, in (xid, seq) order: up to its last row's transaction
	require.EqualValues(t, 230, f.Current())
	f.Observe(c, 200, 10, 10, 230, t0) // and never past the oldest running one
	require.EqualValues(t, 230, f.Current())
}

func TestRescansComeOnTheirSchedule(t *testing.T) {
	f := Floor{Schedule: Schedule{RescanEvery: time.Second, SettleAfter: 10 * time.Second, FullEvery: time.Minute}}
	f.Observe(f.Next(t0), 100, 0, 10, 0, t0)
	// Younger than SettleAfter: the rescan starts at 0.
	require.Equal(t, Claim{Kind: From, From: 0}, f.Next(t0.Add(time.Second)))
	for i := 2; i <= 12; i++ {
		at := t0.Add(time.Duration(i) * time.Second)
		f.Observe(Claim{Kind: From, From: f.Current()}, int64(100+i), 0, 10, 0, at)
	}
	// At 12.5 s, the floor as it was at 2.5 s (set at 2 s: 102).
	now := t0.Add(12500 * time.Millisecond)
	require.Equal(t, Claim{Kind: From, From: 102}, f.Next(now))
	require.Equal(t, Claim{Kind: From, From: 112}, f.Next(now.Add(time.Millisecond)), "one rescan per RescanEvery")
	require.Equal(t, Claim{Kind: Full}, f.Next(t0.Add(time.Minute+time.Second)))
}

func TestALookThatFindsNothingIsTheRescanDone(t *testing.T) {
	f := Floor{Schedule: Schedule{RescanEvery: time.Second, SettleAfter: time.Second, FullEvery: time.Hour}}
	f.Observe(f.Next(t0), 100, 0, 10, 0, t0)
	f.Observe(Claim{Kind: From, From: 100}, 150, 0, 10, 0, t0.Add(1500*time.Millisecond))
	now := t0.Add(2 * time.Second)
	// A rescan is due, from the floor as it was at 1 s.
	require.Equal(t, Claim{Kind: From, From: 100}, f.Look(now))
	f.Looked(now, true) // found rows: the next claim is the rescan
	require.Equal(t, Claim{Kind: From, From: 100}, f.Look(now))
	f.Looked(now, false) // found none: the rescan is done
	require.Equal(t, Claim{Kind: From, From: 150}, f.Look(now))
	require.Equal(t, Claim{Kind: From, From: 150}, f.Next(now))
}

func TestTransactionIDsThatGoBackResetTheFloor(t *testing.T) {
	f := Floor{Schedule: Schedule{RescanEvery: time.Hour, FullEvery: time.Hour}}
	f.Observe(f.Next(t0), 50_000, 0, 10, 0, t0)
	require.EqualValues(t, 50_000, f.Current())
	// A promoted standby hands out lower IDs: its claims see an older xmin.
	// That claim started at 50,000 and saw none of the events below: it
	// moves the floor to 0, not to its xmin.
	f.Observe(Claim{Kind: From, From: 50_000}, 700, 0, 10, 0, t0.Add(time.Second))
	require.Zero(t, f.Current())
	c := f.Next(t0.Add(2 * time.Second))
	require.Equal(t, Claim{Kind: From, From: 0}, c)
	f.Observe(c, 710, 1, 10, 650, t0.Add(2*time.Second))
	require.EqualValues(t, 710, f.Current())
}

func TestALookThatSeesTransactionIDsGoBackResetsTheFloor(t *testing.T) {
	f := Floor{Schedule: Schedule{RescanEvery: time.Hour, FullEvery: time.Hour}}
	f.Observe(f.Next(t0), 50_000, 0, 10, 0, t0)
	floor := f.Current()
	require.False(t, f.Check(floor, 50_003), "a later look sees the same or a younger xmin")
	require.EqualValues(t, 50_000, f.Current())
	require.True(t, f.Check(floor, 700))
	require.Zero(t, f.Current())
	require.Equal(t, Claim{Kind: From, From: 0}, f.Next(t0.Add(time.Second)))
	require.False(t, f.Check(0, 700), "no floor, nothing to reset")
}
