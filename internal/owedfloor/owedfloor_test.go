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
	f.Observe("a", Position{Due: t0, Seq: 7}, look)
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
	f.Observe("a", Position{Due: t0, Seq: 7}, false)
	f.Observe("a", Position{Due: t0, Seq: 5}, false) // a round that claimed below another's floor
	require.Equal(t, Position{Due: t0, Seq: 7}, f.Peek([]string{"a"})[0])
	f.Observe("a", Position{Due: t0.Add(time.Millisecond)}, false)
	require.Equal(t, Position{Due: t0.Add(time.Millisecond)}, f.Peek([]string{"a"})[0])
}

// A look that found pairs below the floor (a long transaction's, committed
// late) lowers it, so that the next claims serve them a batch a round.
func TestALookSetsTheFloorLowerToo(t *testing.T) {
	var f Floors
	f.Observe("a", Position{Due: t0, Seq: 7}, false)
	f.Observe("a", Position{Due: t0.Add(-time.Minute), Seq: 3}, true)
	require.Equal(t, Position{Due: t0.Add(-time.Minute), Seq: 3}, f.Peek([]string{"a"})[0])
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
