package events

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"
)

// A paused subscriber is attempted for nothing while paused: its events stay
// owed to it and the other subscribers' flow; resumed, it gets each once.
func TestPausedSubscriberIsOwedAndResumed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var calls atomic.Int32
	slow := Subscriber{Name: "slow", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			calls.Add(1)
			return testArgs{EventID: e.ID}, nil, nil
		}}
	b := setup(t, setupOpts{}, slow, mapSub("fast", false, "**"))
	b.start(t)
	b.settle(t)
	require.NoError(t, outbox.PauseSubscriber(ctx, b.pool, "slow"))
	require.ErrorIs(t, outbox.PauseSubscriber(ctx, b.pool, "nobody"), ErrUnknownSubscriber)
	es := b.record(t, Event{Type: "a"}, Event{Type: "b"}, Event{Type: "c"})
	waitFannedOut(t, b.pool, 10*time.Second)
	require.Eventually(t, func() bool { return len(loadJobs(t, b.pool)) == 3 }, 30*time.Second, 5*time.Millisecond)
	b.waitIdle(t)
	require.Zero(t, calls.Load(), "nothing is attempted for a paused subscriber")
	pairs := loadPairs(t, b.pool)
	for _, e := range es {
		require.Equal(t, pairRow{}, pairs[e.ID]["slow"], "event %s is owed to slow", e.ID)
	}
	st, err := outbox.GetStats(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, []string{"slow"}, st.Paused)
	require.EqualValues(t, 3, st.Owed)

	require.NoError(t, outbox.ResumeSubscriber(ctx, b.pool, "slow"))
	waitDelivered(t, b.pool, 10*time.Second)
	perPair := map[string]int{}
	for _, j := range loadJobs(t, b.pool) {
		perPair[j.Subscriber+" "+j.EventID.String()]++
	}
	require.Len(t, perPair, 6)
	for pair, n := range perPair {
		require.Equal(t, 1, n, pair)
	}
	require.EqualValues(t, 3, calls.Load())
}

// A subscriber's error is stored safely whatever its bytes — a multi-byte
// rune across the cut, a NUL byte, a megabyte — and OnPoison gets it as the
// subscriber returned it.
func TestPairErrorsAreStoredSafely(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	long := strings.Repeat("é", 1<<19) // 1 MiB, two bytes a rune
	msgs := map[string]string{
		"rune": strings.Repeat("a", maxPairErrorLength-3) + "€€",
		"nul":  "bad\x00byte",
		"huge": long,
	}
	var (
		mu  sync.Mutex
		got = map[string]error{}
	)
	sub := Subscriber{Name: "picky", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			return nil, nil, errors.New(msgs[e.Subject])
		}}
	b := setup(t, setupOpts{config: &RelayConfig{MaxAttempts: 1, OnPoison: func(_ context.Context, e Event, err error) {
		mu.Lock()
		defer mu.Unlock()
		got[e.Subject] = err
	}}}, sub)
	b.start(t)
	es := b.record(t, Event{Type: "a", Subject: "rune"}, Event{Type: "a", Subject: "nul"}, Event{Type: "a", Subject: "huge"})
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 3 }, 30*time.Second, 5*time.Millisecond)
	for _, e := range es {
		info, err := outbox.GetEvent(ctx, b.pool, e.ID)
		require.NoError(t, err)
		require.Len(t, info.Deliveries, 1)
		d := info.Deliveries[0]
		require.True(t, d.Poisoned())
		require.LessOrEqual(t, len(d.LastError), maxPairErrorLength)
		require.NotContains(t, d.LastError, "\x00")
		require.Equal(t, d.LastError, d.Errors[0].Error)
		mu.Lock()
		require.ErrorContains(t, got[e.Subject], msgs[e.Subject], "OnPoison gets the error as written")
		mu.Unlock()
		switch e.Subject {
		case "nul":
			require.Contains(t, d.LastError, `bad\x00byte`)
		case "rune", "huge":
			require.True(t, strings.HasSuffix(d.LastError, "…"), "cut, and the cut is marked")
		}
	}
}
