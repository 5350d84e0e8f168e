package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/owedfloor"
)

// Fresh events flow at about 20 a second or more, or in a burst of three;
// a trickle does not flow, however long it lasts.
func TestFreshEventsFlowAtARateNotAfterEachTrickle(t *testing.T) {
	t.Parallel()
	start := time.Unix(1_000_000, 0)
	steady := func(every time.Duration, n int) (flowsAfter, flowsBefore bool) {
		var m freshMeter
		now := start
		for range n {
			m.claimed(now, 1)
			flowsAfter = m.flowing(now)
			flowsBefore = m.flowing(now.Add(every - time.Millisecond))
			now = now.Add(every)
		}
		return flowsAfter, flowsBefore
	}
	after, _ := steady(100*time.Millisecond, 1000)
	require.False(t, after, "ten events a second flow")
	after, _ = steady(70*time.Millisecond, 1000)
	require.False(t, after, "fourteen events a second flow")
	after, before := steady(20*time.Millisecond, 1000)
	require.True(t, after, "fifty events a second do not flow")
	require.True(t, before, "fifty events a second stop flowing between two")

	var m freshMeter
	require.False(t, m.flowing(start), "nothing claimed yet")
	m.claimed(start, 2)
	require.False(t, m.flowing(start))
	m.claimed(start.Add(time.Millisecond), 1)
	require.True(t, m.flowing(start.Add(time.Millisecond)), "a burst of three does not flow")
	require.False(t, m.flowing(start.Add(150*time.Millisecond)), "a burst flows for ever")
	m.claimed(start.Add(time.Second), 1000)
	require.True(t, m.flowing(start.Add(time.Second+200*time.Millisecond)))
	require.False(t, m.flowing(start.Add(time.Second+300*time.Millisecond)), "a large batch flows for ever")
	m.claimed(start.Add(2*time.Second), 0)
	require.False(t, m.flowing(start.Add(2*time.Second)), "an empty claim flows")

	// A claim whose caller read the clock before another's and took the
	// lock after it counts as of the later one.
	var late freshMeter
	late.claimed(start.Add(time.Second), 1)
	late.claimed(start, 2)
	require.Equal(t, start.Add(time.Second), late.last(), "the meter's clock went back")
	require.True(t, late.flowing(start.Add(time.Second)), "three rows at once do not flow")
}

// A committed claim of owed pairs moves each subscriber's floor to the last
// pair it claimed of that subscriber (no further than the clock less the
// slack), and leaves the floor of a subscriber it claimed nothing of.
func TestObserveOwedMovesEachFloorToItsLastClaimedPair(t *testing.T) {
	t.Parallel()
	now := time.Unix(2_000_000, 0)
	early, later := now.Add(-time.Minute), now.Add(-30*time.Second)
	r := &Relay{owedFloors: &owedfloor.Floors{}}
	batch := []claimedRow{
		{Event: Event{Seq: 5}, owed: []owedPair{{sub: "a", due: early, now: now}}},
		{Event: Event{Seq: 7}, owed: []owedPair{{sub: "a", due: later, now: now}, {sub: "c", due: now, now: now}}},
	}
	names := []string{"a", "b", "c"}
	due, seq := floorArgs(make([]owedfloor.Position, len(names))) // from the start: a look
	r.observeOwed(batch, names, due, seq)
	got := r.owedFloors.Peek(names)
	require.Equal(t, owedfloor.Position{Due: later, Seq: 7}, got[0], "a's floor is its last claimed pair")
	require.Equal(t, owedfloor.Position{}, got[1], "b claimed nothing: its floor stays")
	require.Equal(t, owedfloor.Seen(now, 7, now, owedfloor.Slack), got[2], "c's pair fell due within the slack: the floor stays behind the clock")
}
