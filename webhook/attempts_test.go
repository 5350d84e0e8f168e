package webhook

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
)

// A 200 whose body holds a NUL byte and invalid UTF-8 is logged, escaped,
// and sent once.
func TestResponseWithNULIsLoggedEscapedAndSentOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		_, _ = w.Write([]byte("ok\x00\xff\xfe done"))
	}))
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}})
	require.NoError(t, err)
	e := b.record(t, events.Event{Type: "a"})[0]
	a := b.attempts(t, ep.ID, 1)[0]
	require.Empty(t, a.ErrorClass)
	require.Equal(t, `ok\x00\xff\xfe done`, a.Response)
	require.Eventually(t, func() bool { return b.state(t, e.ID, ep.ID) == "completed" }, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, int32(1), calls.Load())
}

// When the attempt log cannot be written, a delivery that succeeded is not
// sent again: the job completes, and the endpoint's state still records the
// success.
func TestAttemptLogFailureDoesNotResend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls.Add(1) }))
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}})
	require.NoError(t, err)
	// The attempt log refuses every row from now on.
	_, err = b.pool.Exec(ctx, `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'the attempt log is broken'; END $$;
		CREATE TRIGGER refuse BEFORE INSERT ON webhook_attempts FOR EACH ROW EXECUTE FUNCTION refuse()`)
	require.NoError(t, err)
	e := b.record(t, events.Event{Type: "a"})[0]
	require.Eventually(t, func() bool { return b.state(t, e.ID, ep.ID) == "completed" }, 15*time.Second, 10*time.Millisecond,
		"the delivery succeeded: its job completes although the log failed")
	require.Equal(t, int32(1), calls.Load())
	got, err := b.wh.Get(ctx, ep.ID)
	require.NoError(t, err)
	require.False(t, got.LastSuccessAt.IsZero(), "the endpoint's state is written apart from the log")
}

func TestCleanText(t *testing.T) {
	for in, want := range map[string]string{
		"plain":                  "plain",
		"nul\x00byte":            `nul\x00byte`,
		"bad\xffutf8":            `bad\xffutf8`,
		"héllo":                  "héllo",
		"tab\tand\nnewline kept": "tab\tand\nnewline kept",
	} {
		require.Equal(t, want, cleanText([]byte(in)), "%q", in)
	}
	// Cut at the limit, a rune split in two is dropped rather than escaped.
	require.Equal(t, "ab", cleanText(cutRune([]byte("abé"[:3]))))
}
