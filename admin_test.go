package events

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// ListEvents pages each state in its order, filtered by type glob and
// subject, in every exec mode's worth of parameters (NULL filters included).
func TestListEventsByStateWithFiltersAndPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	insertAged(t, b, 3, "poisoned_at, attempts")
	insertAged(t, b, 2, "attempts, next_attempt_at, created_at")
	insertAged(t, b, 4, "fanned_out_at")
	pending := b.record(t, Event{Type: "note.changed", Subject: "note:1"}, Event{Type: "note.deleted", Subject: "note:1"},
		Event{Type: "order.placed", Subject: "order:1"}, Event{Type: "note.changed", Subject: "note:2"})

	count := func(p ListEventsParams) int {
		t.Helper()
		n := 0
		for {
			page, err := outbox.ListEvents(ctx, b.pool, p)
			require.NoError(t, err)
			n += len(page.Events)
			if page.Next == "" {
				return n
			}
			p.After = page.Next
		}
	}
	require.Equal(t, 4, count(ListEventsParams{State: EventPending, Limit: 1}))
	require.Equal(t, 2, count(ListEventsParams{State: EventRetrying, Limit: 1}))
	require.Equal(t, 3, count(ListEventsParams{State: EventPoisoned, Limit: 2}))
	require.Equal(t, 4, count(ListEventsParams{State: EventRecent, Limit: 3}))
	require.Equal(t, 3, count(ListEventsParams{State: EventPending, Type: "note.*", Limit: 2}))
	require.Equal(t, 4, count(ListEventsParams{State: EventPending, Type: "**"}))
	require.Equal(t, 2, count(ListEventsParams{State: EventPending, Type: "note.*", Subject: "note:1"}))
	require.Equal(t, 0, count(ListEventsParams{State: EventPending, Type: "order"}))

	page, err := outbox.ListEvents(ctx, b.pool, ListEventsParams{State: EventPending, Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []string{pending[0].ID.String(), pending[1].ID.String()}, []string{page.Events[0].ID.String(), page.Events[1].ID.String()}, "oldest first")

	for _, bad := range []ListEventsParams{{State: "nope"}, {State: EventPending, Limit: 1001}, {State: EventPending, Type: "a*"}, {State: EventPending, After: "x"}} {
		_, err := outbox.ListEvents(ctx, b.pool, bad)
		require.ErrorIs(t, err, ErrInvalidArgument, "%+v", bad)
	}
}
