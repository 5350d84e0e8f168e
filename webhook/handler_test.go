package webhook

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
)

func signedRequest(t *testing.T, secret, id string, ts time.Time, body string) *http.Request {
	t.Helper()
	sig, err := Sign([]string{secret}, id, ts, []byte(body))
	require.NoError(t, err)
	r := httptest.NewRequest(http.MethodPost, "/hooks", strings.NewReader(body))
	r.Header.Set(HeaderID, id)
	r.Header.Set(HeaderTimestamp, fmt.Sprint(ts.Unix()))
	r.Header.Set(HeaderSignature, sig)
	return r
}

func TestHandlerVerifiesAndRejectsReplays(t *testing.T) {
	old, current := NewSecret(), NewSecret()
	var got []string
	h := Handler([]string{current, old}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, ok := DeliveryFrom(r.Context())
		require.True(t, ok)
		body, _ := io.ReadAll(r.Body)
		got = append(got, d.ID+" "+string(body))
	}))
	serve := func(r *http.Request) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	now := time.Now()
	require.Equal(t, 200, serve(signedRequest(t, current, "evt-1", now, `{"a":1}`)))
	require.Equal(t, 200, serve(signedRequest(t, old, "evt-2", now, `{"a":2}`)), "either secret, during a rotation")
	require.Equal(t, []string{`evt-1 {"a":1}`, `evt-2 {"a":2}`}, got)

	require.Equal(t, 401, serve(signedRequest(t, current, "evt-3", now.Add(-VerifyTolerance-time.Minute), `{}`)), "a replay, too old")
	require.Equal(t, 401, serve(signedRequest(t, current, "evt-3", now.Add(VerifyTolerance+time.Minute), `{}`)), "from the future")
	require.Equal(t, 401, serve(signedRequest(t, NewSecret(), "evt-4", now, `{}`)), "another secret")
	tampered := signedRequest(t, current, "evt-5", now, `{"cents":100}`)
	tampered.Body = io.NopCloser(strings.NewReader(`{"cents":999}`))
	require.Equal(t, 401, serve(tampered))
	require.Equal(t, 401, serve(httptest.NewRequest(http.MethodPost, "/hooks", strings.NewReader("{}"))), "unsigned")
	big := strings.Repeat("x", HandlerMaxBodyBytes+1)
	require.Equal(t, 413, serve(signedRequest(t, current, "evt-6", now, big)))
	require.Len(t, got, 2, "next saw only the verified ones")
}

// Real deliveries through Handler: next learns each delivery's ID, the
// same on every attempt, and does its work once.
func TestHandlerReceivesDeliveries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	var (
		mu    sync.Mutex
		calls = map[string]int{}
		done  = map[string]bool{}
	)
	var secret string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		Handler([]string{secret}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, _ := DeliveryFrom(r.Context())
			mu.Lock()
			defer mu.Unlock()
			if calls[d.ID]++; calls[d.ID] == 1 {
				w.WriteHeader(http.StatusInternalServerError) // fails once: the retry carries the same ID
				return
			}
			done[d.ID] = true
		})).ServeHTTP(w, r)
	}))
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}})
	require.NoError(t, err)
	secret = ep.Secrets[0].Secret
	e := b.record(t, events.Event{Type: "a"})[0]
	b.attempts(t, ep.ID, 1)
	require.Eventually(t, func() bool {
		id, s, _, _ := b.job(t, e.ID, ep.ID)
		if s == "retryable" || s == "available" {
			_, err := b.pool.Exec(ctx, "UPDATE river_job SET scheduled_at = now() WHERE id = $1 AND state IN ('retryable', 'available')", id)
			require.NoError(t, err)
		}
		return s == "completed"
	}, 15*time.Second, 20*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 2, calls[e.ID.String()])
	require.True(t, done[e.ID.String()])
}
