package eventsui_test

import (
	"net/http"
	"testing"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/eventsui"
	"github.com/standmeet/events/internal/testdb"
)

// Config.RiverClient inserts Replay's and Recover's deliveries: a client of
// another schema than Config.Outbox's is refused when the view is built, as
// Relay.Start refuses one, not when an operator presses Replay.
func TestNewHandlerRefusesARiverClientOfAnotherSchema(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	require.NoError(t, err)
	allow := func(*http.Request, eventsui.Action) bool { return true }
	_, err = eventsui.NewHandler(pool, &eventsui.Config{Authorize: allow, Outbox: events.Outbox{Schema: "billing"}, RiverClient: client})
	var ve *events.ValidationError
	require.ErrorAs(t, err, &ve)
	require.ErrorIs(t, err, events.ErrInvalidConfig)
	require.Equal(t, "RiverClient", ve.Field)
	_, err = eventsui.NewHandler(pool, &eventsui.Config{Authorize: allow, RiverClient: client})
	require.NoError(t, err)
}
