package events

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/safetext"
)

// A subscriber's error text is the host's: it may split a rune where
// last_error is cut, hold a NUL byte, or be a megabyte long. Each is stored
// in a form PostgreSQL accepts, readable with Inspect; OnPoison gets the
// error as the subscriber returned it; and the healthy events of the same
// batch go out in that very round, with no backoff.
func TestHostErrorTextIsStoredSafely(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const prefix = `subscriber "mailer": Map: `
	mapErrs := map[string]error{
		// The é takes bytes 1999 and 2000 of the stored message: a cut at
		// 2000 bytes splits it.
		"rune": errors.New(strings.Repeat("a", maxErrorLength-len(prefix)-1) + "é and more"),
		"nul":  errors.New("bad\x00byte"),
		"huge": errors.New(strings.Repeat("x", 1<<20)),
	}
	var (
		mu     sync.Mutex
		alerts = map[uuid.UUID]error{}
		pauses atomic.Int32
	)
	sub := Subscriber{Name: "mailer", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			if err, ok := mapErrs[e.Subject]; ok {
				return nil, nil, err
			}
			return testArgs{EventID: e.ID}, nil, nil
		}}
	b := setup(t, setupOpts{config: &RelayConfig{MaxAttempts: 1, OnPoison: func(_ context.Context, e Event, err error) {
		mu.Lock()
		defer mu.Unlock()
		alerts[e.ID] = err
	}}}, sub)
	b.relay.hooks.pause = func(context.Context, time.Duration) bool {
		pauses.Add(1) // a failed round backs off
		return true
	}
	es := b.record(t,
		Event{Type: "a", Subject: "ok:1"}, Event{Type: "a", Subject: "rune"}, Event{Type: "a", Subject: "ok:2"},
		Event{Type: "a", Subject: "nul"}, Event{Type: "a", Subject: "ok:3"}, Event{Type: "a", Subject: "huge"},
		Event{Type: "a", Subject: "ok:4"})
	b.start(t)

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(alerts) == len(mapErrs)
	}, 10*time.Second, 5*time.Millisecond)
	require.Zero(t, pauses.Load(), "a round failed and backed off")

	var fannedAt []time.Time
	for _, e := range es {
		info, err := outbox.Inspect(ctx, b.pool, e.ID)
		require.NoError(t, err)
		mapErr, bad := mapErrs[e.Subject]
		if !bad {
			require.False(t, info.FannedOutAt.IsZero(), "%s not fanned out", e.Subject)
			fannedAt = append(fannedAt, info.FannedOutAt)
			continue
		}
		require.True(t, info.Poisoned(), e.Subject)
		require.Equal(t, 1, info.Attempts, e.Subject)
		stored := info.LastError
		require.True(t, utf8.ValidString(stored), "%s: %q", e.Subject, stored)
		require.NotContains(t, stored, "\x00", e.Subject)
		require.LessOrEqual(t, len(stored), maxErrorLength, e.Subject)
		require.Equal(t, safetext.Clip(prefix+mapErr.Error(), maxErrorLength), stored, e.Subject)
		switch e.Subject {
		case "rune":
			require.Equal(t, prefix+strings.Repeat("a", maxErrorLength-len(prefix)-len(safetext.Ellipsis))+safetext.Ellipsis, stored)
		case "nul":
			require.Equal(t, prefix+`bad\x00byte`, stored)
		case "huge":
			require.True(t, strings.HasPrefix(stored, prefix+"xxxx"), stored[:100])
			require.True(t, strings.HasSuffix(stored, safetext.Ellipsis), "the cut is marked")
		}

		mu.Lock()
		got := alerts[e.ID]
		mu.Unlock()
		require.ErrorIs(t, got, mapErr, "OnPoison gets the subscriber's error")
		require.Contains(t, got.Error(), mapErr.Error(), "OnPoison gets the error text as written")
	}
	require.Len(t, fannedAt, 4)
	for _, at := range fannedAt {
		require.Equal(t, fannedAt[0], at, "the healthy events went out in one round")
	}
}
