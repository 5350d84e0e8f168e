package owedfloor

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

func TestARunsFirstClaimLooksAndThenOneEveryLookEvery(t *testing.T) {
	var f Floors
	names := []string{"a", "b"}
	from, look := f.Next(names, t0)
	require.True(t, look)
	require.Equal(t, []Position{{}, {}}, from)
	f.Observe("a", from[0], Position{Due: t0, Seq: 7})
	from, look = f.Next(names, t0.Add(LookEvery/2))
	require.False(t, look)
	require.Equal(t, []Position{{Due: t0, Seq: 7}, {}}, from)
	from, look = f.Next(names, t0.Add(LookEvery))
	require.True(t, look, "no look after LookEvery")
	require.Equal(t, []Position{{}, {}}, from)
	require.Equal(t, []Position{{Due: t0, Seq: 7}, {}}, f.Peek(names), "a look moved a floor before its claim")
}

func TestAClaimFromTheFloorsOnlyRaisesThem(t *testing.T) {
	var f Floors
	f.Observe("a", Position{}, Position{Due: t0, Seq: 7})
	f.Observe("a", Position{Due: t0, Seq: 1}, Position{Due: t0, Seq: 5}) // a round that claimed below another's floor
	require.Equal(t, Position{Due: t0, Seq: 7}, f.Peek([]string{"a"})[0])
	f.Observe("a", Position{Due: t0, Seq: 7}, Position{Due: t0.Add(time.Millisecond)})
	require.Equal(t, Position{Due: t0.Add(time.Millisecond)}, f.Peek([]string{"a"})[0])
}

// A look that found pairs below the floor (a long transaction's, committed
// late) lowers it, so that the next claims serve them a batch a round; a
// claim that started from the floor before the look, and commits after it,
// does not raise it back over pairs neither read (found by review).
func TestALookSetsTheFloorLowerAndAClaimFromAboveDoesNotUndoIt(t *testing.T) {
	var f Floors
	high := Position{Due: t0, Seq: 1000}
	f.Observe("a", Position{}, high)
	from := f.Peek([]string{"a"})[0] // a claim starts here
	lookEnd := Position{Due: t0.Add(-time.Minute), Seq: 100}
	f.Observe("a", Position{}, lookEnd) // the look, from the start, commits first
	require.Equal(t, lookEnd, f.Peek([]string{"a"})[0])
	f.Observe("a", from, Position{Due: t0, Seq: 1200}) // then the claim
	require.Equal(t, lookEnd, f.Peek([]string{"a"})[0], "a claim raised the floor over pairs it did not read")
	f.Observe("a", lookEnd, Position{Due: t0.Add(-time.Minute), Seq: 200}) // a claim from the lowered floor
	require.Equal(t, Position{Due: t0.Add(-time.Minute), Seq: 200}, f.Peek([]string{"a"})[0])
}

// After the database restarted the floors are gone, and the next claim is a
// look: a crash may have lost rounds that moved them.
func TestResetMakesTheNextClaimALook(t *testing.T) {
	var f Floors
	names := []string{"a"}
	_, look := f.Next(names, t0)
	require.True(t, look)
	f.Observe("a", Position{}, Position{Due: t0, Seq: 7})
	f.Reset()
	from, look := f.Next(names, t0.Add(time.Millisecond))
	require.True(t, look)
	require.Equal(t, []Position{{}}, from)
	require.Equal(t, []Position{{}}, f.Peek(names))
}

// A pair due within Slack of the clock at its claim moves the floor to the
// clock less Slack: a transaction still running may yet commit a pair due
// that early.
func TestSeenStaysSlackBehindTheClock(t *testing.T) {
	require.Equal(t, Position{Due: t0.Add(-time.Minute), Seq: 9}, Seen(t0.Add(-time.Minute), 9, t0, Slack))
	require.Equal(t, Position{Due: t0.Add(-Slack)}, Seen(t0.Add(-Slack/2), 9, t0, Slack))
	require.True(t, Position{Due: t0, Seq: 2}.After(Position{Due: t0, Seq: 1}))
	require.False(t, Position{Due: t0, Seq: 2}.After(Position{Due: t0.Add(time.Nanosecond)}))
}
