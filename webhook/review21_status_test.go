package webhook

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
)

// rawStatus answers every request with the raw status line given (no
// validation by net/http on the reason phrase), after counting it.
func rawStatus(t *testing.T, calls *atomic.Int32, statusLine string) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		_, _ = buf.WriteString(statusLine + "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		_ = buf.Flush()
		_, _ = bufio.NewReader(conn).Peek(1)
	}))
}

// A hostile receiver answers "500 <NUL>": the failure handed to River holds
// the NUL, which River stores in river_job.errors (jsonb cannot hold \u0000),
// so River's completer fails the whole batch and requeues it forever: the
// job stays running, and so does every job whose completion is batched
// with it, such as a delivery to another, healthy endpoint that succeeded
// (rescued later, it is sent again).
func TestStatusLineWithNULDoesNotWedgeRiver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{BreakerThreshold: 1000})
	var badCalls, goodCalls atomic.Int32
	bad := rawStatus(t, &badCalls, "HTTP/1.1 500 Bad\x00Reason")
	defer bad.Close()
	good := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { goodCalls.Add(1) }))
	defer good.Close()
	badEP, err := b.wh.Create(ctx, EndpointParams{URL: bad.URL, Types: []string{"bad"}})
	require.NoError(t, err)
	goodEP, err := b.wh.Create(ctx, EndpointParams{URL: good.URL, Types: []string{"good"}})
	require.NoError(t, err)

	e1 := b.record(t, events.Event{Type: "bad"})[0]
	a := b.attempts(t, badEP.ID, 1)[0]
	require.Equal(t, 500, a.Status)

	e2 := b.record(t, events.Event{Type: "good"})[0]
	require.Eventually(t, func() bool { return goodCalls.Load() > 0 }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return b.state(t, e2.ID, goodEP.ID) == "completed" }, 10*time.Second, 10*time.Millisecond,
		"another endpoint's delivery, which succeeded, completes; state %s", b.state(t, e2.ID, goodEP.ID))
	require.Equal(t, int32(1), goodCalls.Load())
	require.Eventually(t, func() bool { s := b.state(t, e1.ID, badEP.ID); return s == "retryable" || s == "available" },
		10*time.Second, 10*time.Millisecond, "the failed delivery's error is recorded by River; state %s", b.state(t, e1.ID, badEP.ID))
}

// A hostile receiver answers with a status line of a megabyte (net/http
// reads up to 10 MB of it): the attempt log and River's errors of the job,
// kept for every try, must not store it whole.
func TestHugeStatusLineIsNotStoredWhole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{BreakerThreshold: 1000})
	var calls atomic.Int32
	srv := rawStatus(t, &calls, "HTTP/1.1 500 "+strings.Repeat("A", 1<<20))
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}})
	require.NoError(t, err)
	e := b.record(t, events.Event{Type: "a"})[0]
	a := b.attempts(t, ep.ID, 1)[0]
	require.Equal(t, 500, a.Status)
	require.LessOrEqual(t, len(a.Error), 4<<10, "the attempt log keeps the start of the error only")
	require.Eventually(t, func() bool { s := b.state(t, e.ID, ep.ID); return s == "retryable" || s == "available" },
		10*time.Second, 10*time.Millisecond)
	var size int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT octet_length(errors::text) FROM river_job WHERE kind = 'webhook.deliver'
		AND args->>'endpoint_id' = $1`, ep.ID.String()).Scan(&size))
	require.LessOrEqual(t, size, 8<<10, "river_job.errors keeps the start of the error only")
}
