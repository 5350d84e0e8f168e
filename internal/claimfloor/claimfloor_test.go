package claimfloor

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func TestTheFirstClaimIsFromTheStart(t *testing.T) {
	var f Floor
	require.Equal(t, Claim{Kind: Full}, f.Next())
	require.Zero(t, f.Current())
	// A full batch in seq order leaves the floor at 0; the next claims are
	// in the floor's order, and a full one of them moves it.
	f.Observe(Claim{Kind: Full}, At(500), 10, 10, Position{}, t0)
	c := f.Next()
	require.Equal(t, Claim{Kind: From, From: 0}, c)
	f.Observe(c, At(500), 10, 10, Position{Xid: 120}, t0)
	require.EqualValues(t, 120, f.Current())
}

func TestAShortClaimMovesTheFloorToTheOldestRunningTransaction(t *testing.T) {
	var f Floor
	c := f.Next()
	f.Observe(c, At(100), 3, 10, Position{}, t0)
	require.EqualValues(t, 100, f.Current())
	require.Equal(t, Claim{Kind: From, From: 100}, f.Next())
	// Never back down: a round that began before the one that moved the
	// floor, and ends after it, read an older xmin.
	f.Observe(Claim{Kind: From, From: 80}, At(90), 0, 10, Position{}, t0)
	require.EqualValues(t, 100, f.Current())
}

func TestAFullClaimMovesTheFloorOnlyInTransactionOrder(t *testing.T) {
	var f Floor
	c := f.Next()
	f.Observe(c, At(500), 10, 10, Position{}, t0) // full, in seq order: rows may be left anywhere
	require.Zero(t, f.Current())
	f.Observe(c, At(100), 1, 10, Position{}, t0)
	c = f.Next()
	require.Equal(t, Claim{Kind: From, From: 100}, c)
	f.Observe(c, At(500), 10, 10, Position{Xid: 230}, t0) // full, in (xid, seq) order: up to its last row's transaction
	require.EqualValues(t, 230, f.Current())
	f.Observe(c, At(200), 10, 10, Position{Xid: 230}, t0) // and never past the oldest running one
	require.EqualValues(t, 230, f.Current())
}

func TestLooksBelowComeOnTheirSchedule(t *testing.T) {
	f := Floor{Schedule: Schedule{RescanEvery: time.Second, SettleAfter: 10 * time.Second, FullEvery: time.Minute}}
	_, ok := f.LookBelow(t0)
	require.False(t, ok, "no floor, nothing below it")
	f.Observe(f.Next(), At(100), 0, 10, Position{}, t0)
	_, ok = f.LookBelow(t0.Add(500 * time.Millisecond))
	require.False(t, ok, "not due yet")
	for i := 1; i <= 12; i++ {
		at := t0.Add(time.Duration(i) * time.Second)
		f.Observe(Claim{Kind: From, From: f.Current()}, At(int64(100+i)), 0, 10, Position{}, at)
	}
	// At 12.5 s, the floor as it was at 2.5 s (set at 2 s: 102), up to
	// the floor.
	now := t0.Add(12500 * time.Millisecond)
	require.Equal(t, time.Duration(0), f.NextLookIn(now))
	b, ok := f.LookBelow(now)
	require.True(t, ok)
	require.Equal(t, Below{From: 102, Below: 112}, b)
	require.Equal(t, time.Second, f.NextLookIn(now), "one look per RescanEvery")
	_, ok = f.LookBelow(now.Add(time.Millisecond))
	require.False(t, ok)
	// A minute after the start's, the look from the start.
	b, ok = f.LookBelow(t0.Add(time.Minute + time.Second))
	require.True(t, ok)
	require.Equal(t, Below{From: 0, Below: 112}, b)
	// The claims never go below the floor themselves.
	require.Equal(t, Claim{Kind: From, From: 112}, f.Next())
	// A reconnect makes the look from the start due at once.
	f.LookSoon()
	b, ok = f.LookBelow(t0.Add(time.Minute + 2*time.Second))
	require.True(t, ok)
	require.Equal(t, Below{From: 0, Below: 112}, b)
}

func TestARowFoundBelowLowersTheFloorUntilAClaimFromThereMovesIt(t *testing.T) {
	f := Floor{Schedule: Schedule{RescanEvery: time.Second, SettleAfter: time.Second, FullEvery: time.Hour}}
	f.Observe(f.Next(), At(100), 0, 10, Position{}, t0)
	f.Observe(Claim{Kind: From, From: 100}, At(150), 0, 10, Position{}, t0.Add(1500*time.Millisecond))
	inFlight := f.Next() // a claim from 150 runs
	require.Equal(t, Claim{Kind: From, From: 150}, inFlight)
	f.Lower(120) // a look found a pending row of transaction 120
	require.EqualValues(t, 120, f.Current())
	settled, _ := f.Settled(t0.Add(3 * time.Second))
	require.EqualValues(t, 120, settled, "no settled look starts above the row either")
	// The claim from 150 ends: it never looked at 120, and moves nothing.
	f.Observe(inFlight, At(160), 0, 10, Position{}, t0.Add(2*time.Second))
	require.EqualValues(t, 120, f.Current())
	c := f.Next()
	require.Equal(t, Claim{Kind: From, From: 120}, c)
	f.Observe(c, At(165), 3, 10, Position{}, t0.Add(2*time.Second))
	require.EqualValues(t, 165, f.Current())
	f.Lower(200)
	require.EqualValues(t, 165, f.Current(), "lowering never raises")
}

func TestTransactionIDsThatGoBackResetTheFloor(t *testing.T) {
	f := Floor{Schedule: Schedule{RescanEvery: time.Hour, FullEvery: time.Hour}}
	f.Observe(f.Next(), At(50_000), 0, 10, Position{}, t0)
	require.EqualValues(t, 50_000, f.Current())
	// A promoted standby hands out lower IDs: its claims see an older xmin.
	// That claim started at 50,000 and saw none of the events below: it
	// moves the floor to 0, not to its xmin.
	f.Observe(Claim{Kind: From, From: 50_000}, At(700), 0, 10, Position{}, t0.Add(time.Second))
	require.Zero(t, f.Current())
	c := f.Next()
	require.Equal(t, Claim{Kind: From, From: 0}, c)
	f.Observe(c, At(710), 1, 10, Position{Xid: 650}, t0.Add(2*time.Second))
	require.EqualValues(t, 710, f.Current())
}

func TestALookThatSeesTransactionIDsGoBackResetsTheFloor(t *testing.T) {
	f := Floor{Schedule: Schedule{RescanEvery: time.Hour, FullEvery: time.Hour}}
	f.Observe(f.Next(), At(50_000), 0, 10, Position{}, t0)
	look := f.Look()
	require.False(t, f.Check(look, 50_003), "a later look sees the same or a younger xmin")
	require.EqualValues(t, 50_000, f.Current())
	require.True(t, f.Check(look, 700))
	require.Zero(t, f.Current())
	require.Equal(t, Claim{Kind: From, From: 0}, f.Next())
	require.False(t, f.Check(f.Look(), 700), "no floor, nothing to reset")
}

// A failover to a standby that was behind hands out transaction IDs below
// the floor proper but above a transaction the floor keeps as running (a
// writer left open before the failover): the oldest running one is then
// outside the floor, which cannot happen unless IDs went back, and the
// floor starts again from 0, whether a claim or an idle relay's poll sees
// it first.
func TestTransactionIDsThatGoBackIntoAGapOfTheFloorResetIt(t *testing.T) {
	f := Floor{Schedule: Schedule{RescanEvery: time.Hour, FullEvery: time.Hour}}
	f.Observe(f.Next(), Snapshot{Xmin: 100, Xmax: 5_000, Running: []int64{100}}, 0, 10, Position{}, t0)
	c := f.Next()
	require.Equal(t, Claim{Kind: From, From: 5_000, Running: []int64{100}}, c)
	require.False(t, f.Check(c, 100), "the writer still runs")

	// The promoted standby: the writer is gone, new transactions get IDs
	// from 3,000. The claim read 100 and from 5,000 on: none of 3,001 to
	// 3,004, which committed events.
	f.Observe(c, Snapshot{Xmin: 3_000, Xmax: 3_005, Running: []int64{3_000}}, 0, 10, Position{}, t0.Add(time.Second))
	require.Equal(t, Claim{Kind: From}, f.Next(), "the next claim is from 0")

	// The same go-back, seen by a poll.
	var g Floor
	g.Observe(g.Next(), Snapshot{Xmin: 100, Xmax: 5_000, Running: []int64{100}}, 0, 10, Position{}, t0)
	require.True(t, g.Check(g.Look(), 3_000))
	require.Equal(t, Claim{Kind: From}, g.Next())
}

// With a writer left open, the settled look covers what the floor read
// SettleAfter ago and reads no longer: not everything from the writer on,
// which the writer keeps VACUUM from removing (every RescanEvery, that walk
// would only have moved from the claims to the looks).
func TestTheSettledLookDoesNotWalkFromAWriterLeftOpen(t *testing.T) {
	f := Floor{Schedule: Schedule{RescanEvery: time.Second, SettleAfter: 5 * time.Second, FullEvery: time.Hour}}
	_, _ = f.LookBelow(t0) // the look from the start: due at once, next in an hour
	for i := range 20 {
		xmax := int64(10_000 + 1_000*i)
		running := []int64{100}
		if i < 14 {
			running = append(running, 12_500) // a transaction that ends at 14 s
		}
		f.Observe(f.Next(), Snapshot{Xmin: 100, Xmax: xmax, Running: running}, 0, 10, Position{}, t0.Add(time.Duration(i)*time.Second))
		if i == 18 {
			// At 18.5 s, the floor 5 s before (set at 13 s) read 100,
			// 12,500 and from 23,000 on: 12,500 has left the floor since.
			look, ok := f.LookBelow(t0.Add(18500 * time.Millisecond))
			require.True(t, ok)
			require.Equal(t, Below{From: 23_000, Below: 28_000, Dropped: []int64{12_500}, Skip: []int64{100}}, look)
		}
	}
	// At 20 s, the floor set at 15 s read 100 and from 25,000 on.
	look, ok := f.LookBelow(t0.Add(20 * time.Second))
	require.True(t, ok)
	require.Equal(t, Below{From: 25_000, Below: 29_000, Skip: []int64{100}}, look)
}

func TestAFloorStartsFromAnotherRelaysFloor(t *testing.T) {
	var f Floor
	require.Nil(t, f.Stored(), "no floor to write")
	f.Start(0, t0)
	require.Equal(t, Claim{Kind: Full}, f.Look(), "none: from the start")
	f.Start(400, t0)
	require.Equal(t, Claim{Kind: From, From: 400}, f.Next())
	require.EqualValues(t, 400, *f.Stored())
	f.Start(900, t0)
	require.EqualValues(t, 400, f.Current(), "a floor that has claimed keeps its own")
	// The look from the start comes SettleAfter (5 s) after the start.
	b, ok := f.LookBelow(t0)
	require.False(t, ok)
	require.Equal(t, Below{}, b)
	b, ok = f.LookBelow(t0.Add(5 * time.Second))
	require.True(t, ok)
	require.Equal(t, Below{From: 0, Below: 400}, b)
}

func TestAFailedRoundPutsTheFloorBackWhereItsClaimStarted(t *testing.T) {
	f := Floor{Schedule: Schedule{RescanEvery: time.Hour, SettleAfter: time.Second, FullEvery: time.Hour}}
	f.Observe(f.Next(), At(100), 0, 10, Position{}, t0)
	failing := f.Next() // holds rows from 100 on
	require.Equal(t, Claim{Kind: From, From: 100}, failing)
	// Another round, from 100 too, skipped them (locked) and came back short.
	f.Observe(Claim{Kind: From, From: 100}, At(180), 2, 10, Position{}, t0.Add(2*time.Millisecond))
	require.EqualValues(t, 180, f.Current())
	f.Failed(failing) // its rows are pending again, from 100 on
	require.EqualValues(t, 100, f.Current())
	require.Equal(t, Claim{Kind: From, From: 100}, f.Next())

	// A failed first claim from the start: the next is from the start too.
	var g Floor
	c := g.Next()
	require.Equal(t, Claim{Kind: Full}, c)
	g.Failed(c)
	require.Equal(t, Claim{Kind: Full}, g.Next())
}

func TestParseSnapshot(t *testing.T) {
	s, err := ParseSnapshot("100:500:300,100")
	require.NoError(t, err)
	require.Equal(t, Snapshot{Xmin: 100, Xmax: 500, Running: []int64{100, 300}}, s)
	s, err = ParseSnapshot("742:742:")
	require.NoError(t, err)
	require.Equal(t, At(742), s)
	for _, bad := range []string{"", "1:2", "x:2:", "1:y:", "1:2:3,z"} {
		_, err := ParseSnapshot(bad)
		require.ErrorContains(t, err, "claimfloor: snapshot", bad)
	}
}

// A transaction left running (a console's BEGIN after an UPDATE, a long
// batch job) stays in the floor as itself: the claims read it, and every
// transaction from the snapshot's xmax on, not everything since it began.
func TestATransactionLeftRunningStaysInTheFloorAsItself(t *testing.T) {
	f := Floor{Schedule: Schedule{RescanEvery: time.Hour, SettleAfter: time.Second, FullEvery: time.Hour}}
	f.Observe(f.Next(), Snapshot{Xmin: 100, Xmax: 500, Running: []int64{100, 300}}, 3, 10, Position{}, t0)
	c := f.Next()
	require.Equal(t, Claim{Kind: From, From: 500, Running: []int64{100, 300}}, c)
	require.EqualValues(t, 100, f.Current(), "no transaction below 100 runs")
	require.EqualValues(t, 100, *f.Stored())

	// 300 ended (its rows were visible to the claim), 650 began.
	f.Observe(c, Snapshot{Xmin: 100, Xmax: 800, Running: []int64{100, 650}}, 0, 10, Position{}, t0.Add(time.Second))
	c = f.Next()
	require.Equal(t, Claim{Kind: From, From: 800, Running: []int64{100, 650}}, c)

	// A full claim got as far as 820: it may have left rows from there
	// on, and any of the transactions running at its snapshot.
	f.Observe(c, Snapshot{Xmin: 100, Xmax: 900, Running: []int64{100, 650, 850}}, 10, 10, Position{Xid: 820}, t0.Add(2*time.Second))
	c = f.Next()
	require.Equal(t, Claim{Kind: From, From: 820, Running: []int64{100, 650}}, c)

	// The looks below skip what the claims read.
	b, ok := f.LookBelow(t0.Add(3 * time.Second))
	require.True(t, ok)
	require.Equal(t, Below{From: 0, Below: 820, Skip: []int64{100, 650}}, b) // the first is from the start

	// A look's xmin: 100 still runs, and it is in the floor.
	require.False(t, f.Check(f.Look(), 100))
	require.Equal(t, c, f.Next())

	// A round that held rows from 820 on (and of 100 and 650) fails after
	// another moved the floor past them: the floor reads them again.
	f.Observe(c, Snapshot{Xmin: 100, Xmax: 1000, Running: []int64{100}}, 0, 10, Position{}, t0.Add(4*time.Second))
	require.Equal(t, Claim{Kind: From, From: 1000, Running: []int64{100}}, f.Next())
	f.Failed(c)
	require.Equal(t, Claim{Kind: From, From: 820, Running: []int64{100, 650}}, f.Next())

	// A claim that did not read all the floor now reads moves nothing.
	f.Observe(Claim{Kind: From, From: 1000, Running: []int64{100}}, Snapshot{Xmin: 100, Xmax: 1100, Running: []int64{100}}, 0, 10, Position{}, t0.Add(5*time.Second))
	require.Equal(t, Claim{Kind: From, From: 820, Running: []int64{100, 650}}, f.Next())

	// A row found below lowers the floor proper; the running below it stay.
	f.Lower(200)
	require.Equal(t, Claim{Kind: From, From: 200, Running: []int64{100}}, f.Next())
	settled, _ := f.Settled(t0.Add(10 * time.Second))
	require.EqualValues(t, 100, settled)

	// IDs that go back below the oldest the floor reads reset it.
	f.Observe(f.Next(), Snapshot{Xmin: 90, Xmax: 95}, 0, 10, Position{}, t0.Add(6*time.Second))
	require.Zero(t, f.Current())
}

// A floor keeps MaxRunning running transactions at most: beyond them the
// floor proper comes down to the next, which reads more, never less.
func TestAFloorKeepsAtMostMaxRunningTransactions(t *testing.T) {
	var f Floor
	s := Snapshot{Xmin: 1000, Xmax: 5000}
	for i := range MaxRunning + 8 {
		s.Running = append(s.Running, int64(1000+10*i))
	}
	f.Observe(f.Next(), s, 0, 10, Position{}, t0)
	c := f.Next()
	require.Len(t, c.Running, MaxRunning)
	require.Equal(t, s.Running[:MaxRunning], c.Running)
	require.Equal(t, s.Running[MaxRunning], c.From)
}

// A full claim ends at a row: the next starts after it, not at its
// transaction's first row (a backlog one transaction recorded is drained
// batch after batch, each starting where the last ended).
func TestAFullClaimMovesTheFloorPastItsLastRow(t *testing.T) {
	f := Floor{Schedule: Schedule{RescanEvery: time.Second, SettleAfter: time.Second, FullEvery: time.Hour}}
	f.Observe(f.Next(), At(100), 0, 10, Position{}, t0)
	_, _ = f.LookBelow(t0) // the first look, from the start
	c := f.Next()
	f.Observe(c, At(500), 10, 10, Position{Xid: 230, Seq: 57}, t0)
	c = f.Next()
	require.Equal(t, Claim{Kind: From, From: 230, FromSeq: 57}, c)
	require.EqualValues(t, 230, f.Current())
	f.Observe(c, At(500), 10, 10, Position{Xid: 230, Seq: 67}, t0.Add(time.Second))
	require.Equal(t, Claim{Kind: From, From: 230, FromSeq: 67}, f.Next())
	// The settled look reaches the rows of 230 up to the floor's.
	b, ok := f.LookBelow(t0.Add(1500 * time.Millisecond))
	require.True(t, ok)
	require.Equal(t, Below{From: 230, Below: 230, BelowSeq: 67}, b)
	// A claim that began at 57 and fails: the floor goes back to 57.
	f.Failed(c)
	require.Equal(t, Claim{Kind: From, From: 230, FromSeq: 57}, f.Next())
	// A row of 230 found below: all of 230 again.
	f.Lower(230)
	require.Equal(t, Claim{Kind: From, From: 230}, f.Next())
	// A failed claim that read all of 230 as a running transaction.
	f.Observe(f.Next(), At(500), 10, 10, Position{Xid: 240, Seq: 9}, t0.Add(3*time.Second))
	require.Equal(t, Claim{Kind: From, From: 240, FromSeq: 9}, f.Next())
	f.Failed(Claim{Kind: From, From: 300, Running: []int64{240}})
	require.Equal(t, Claim{Kind: From, From: 240}, f.Next())
}
