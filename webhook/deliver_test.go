package webhook

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/testdb"
)

// Replay and Recover insert deliveries through the client they are given;
// like Relay.Start they refuse a River client of another schema than the
// Outbox's (its jobs would land where no worker of this outbox looks), and a
// nil one, instead of inserting the job elsewhere or panicking.
func TestReplayRefusesAClientOfAnotherSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	billing := events.Outbox{Schema: "billing"}
	require.NoError(t, billing.Migrate(ctx, pool))
	wh, err := New(pool, &Config{Outbox: billing, Keys: []Key{testKey("k")}, AllowedNetworks: loopback})
	require.NoError(t, err)
	ep, err := wh.Create(ctx, EndpointParams{URL: "http://127.0.0.1:1/hooks", Types: []string{"**"}})
	require.NoError(t, err)
	var e events.Event
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		e, err = billing.Record(ctx, tx, events.Event{Type: "order.placed"})
		return err
	}))
	searchPath, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	require.NoError(t, err)

	err = wh.Replay(ctx, searchPath, e.ID, ep.ID)
	var ve *events.ValidationError
	require.ErrorAs(t, err, &ve)
	require.ErrorIs(t, err, events.ErrInvalidConfig)
	require.Equal(t, "client", ve.Field)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM public.river_job").Scan(&n))
	require.Zero(t, n, "a delivery job inserted in the search_path's schema")
	_, err = wh.Recover(ctx, searchPath, ep.ID, e.CreatedAt.Add(-1), e.CreatedAt.Add(1))
	require.ErrorIs(t, err, events.ErrInvalidConfig)

	require.ErrorIs(t, wh.Replay(ctx, nil, e.ID, ep.ID), events.ErrInvalidConfig, "a nil client")

	// The client of the Outbox's schema inserts the delivery there.
	inBilling, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: "billing"})
	require.NoError(t, err)
	require.NoError(t, wh.Replay(ctx, inBilling, e.ID, ep.ID))
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM billing.river_job WHERE kind = 'webhook.deliver'").Scan(&n))
	require.Equal(t, 1, n)
}

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
	require.Eventually(t, func() bool { return goodCalls.Load() > 0 }, 30*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return b.state(t, e2.ID, goodEP.ID) == "completed" }, 30*time.Second, 10*time.Millisecond,
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

// A network failure's error is net/http's *url.Error, which names the whole
// URL, query included, where tokens live (the disabled event leaves them
// out for that reason): neither the attempt log nor river_job.errors (shown
// by River UI) keeps it.
func TestNetworkErrorNamesNoURLQuery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{BreakerThreshold: 1000})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there now: connection refused
	const token = "tok-3f9a1c77"
	ep, err := b.wh.Create(ctx, EndpointParams{URL: "http://" + addr + "/hooks?token=" + token, Types: []string{"**"}})
	require.NoError(t, err)
	e := b.record(t, events.Event{Type: "a"})[0]
	a := b.attempts(t, ep.ID, 1)[0]
	require.Equal(t, "network", a.ErrorClass)
	require.NotContains(t, a.Error, token)
	require.Eventually(t, func() bool { s := b.state(t, e.ID, ep.ID); return s == "retryable" || s == "available" },
		10*time.Second, 10*time.Millisecond)
	var errs string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT errors::text FROM river_job WHERE kind = 'webhook.deliver'
		AND args->>'endpoint_id' = $1`, ep.ID.String()).Scan(&errs))
	require.NotContains(t, errs, token)
}

// The disabled event is recorded in each of the endpoint's scopes, so the
// tenant's own endpoints hear it, and carries the endpoint's ID and host but
// never its URL's path or query.
func TestDisabledEventCarriesScopesNotURL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	var mu sync.Mutex
	bodies := map[string][]string{} // path -> bodies received
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/dying" {
			w.WriteHeader(http.StatusGone)
			return
		}
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies[r.URL.Path] = append(bodies[r.URL.Path], string(body))
		mu.Unlock()
	}))
	defer srv.Close()
	dying, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL + "/dying?token=s3cr3t", Types: []string{"order.*"},
		Scopes: []string{"tenant:1", "tenant:2"}})
	require.NoError(t, err)
	tenant2, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL + "/tenant2", Types: []string{"webhook.**"}, Scopes: []string{"tenant:2"}})
	require.NoError(t, err)
	all, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL + "/all", Types: []string{"webhook.**"}})
	require.NoError(t, err)
	b.record(t, events.Event{Type: "order.placed", Scope: "tenant:1"})

	b.attempts(t, tenant2.ID, 1)
	b.attempts(t, all.ID, 2)
	rows, err := b.pool.Query(ctx, "SELECT scope, payload FROM outbox_events WHERE type = $1 ORDER BY scope", EventEndpointDisabled)
	require.NoError(t, err)
	type row struct {
		Scope   string
		Payload []byte
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	require.Len(t, got, 2, "one per scope")
	u, _ := url.Parse(srv.URL)
	for i, scope := range []string{"tenant:1", "tenant:2"} {
		require.Equal(t, scope, got[i].Scope)
		var p map[string]any
		require.NoError(t, json.Unmarshal(got[i].Payload, &p))
		require.Equal(t, dying.ID.String(), p["endpoint_id"])
		require.Equal(t, u.Host, p["host"])
		require.ElementsMatch(t, []any{"tenant:1", "tenant:2"}, p["scopes"])
		require.NotContains(t, string(got[i].Payload), "s3cr3t")
		require.NotContains(t, string(got[i].Payload), "/dying")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, bodies["/tenant2"], 1, "the tenant's own endpoint hears its scope's event")
	for _, body := range append(bodies["/all"], bodies["/tenant2"]...) {
		require.True(t, strings.Contains(body, dying.ID.String()))
		require.NotContains(t, body, "s3cr3t")
	}
}

// busyForever answers every request with 503 and Retry-After: 1, and counts
// them.
func busyForever(calls *atomic.Int32) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
}

// An endpoint that answers 503 + Retry-After: 1 forever is disabled after
// AutoDisableAfter, like any failing endpoint: the snooze counts.
func TestRetryAfterCountsTowardAutoDisable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{AutoDisableAfter: 2 * time.Second})
	var calls atomic.Int32
	srv := busyForever(&calls)
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}})
	require.NoError(t, err)
	e := b.record(t, events.Event{Type: "a"})[0]
	require.Eventually(t, func() bool {
		got, err := b.wh.Get(ctx, ep.ID)
		require.NoError(t, err)
		return !got.Enabled
	}, 20*time.Second, 20*time.Millisecond, "disabled after 2 s of 503s")
	require.Eventually(t, func() bool { return b.state(t, e.ID, ep.ID) == "cancelled" }, 30*time.Second, 10*time.Millisecond)
	require.LessOrEqual(t, calls.Load(), int32(6), "about one request a second for two seconds")
}

// Retry-After answers are tries like any other: after MaxAttempts of them the
// delivery is given up, and the log numbers them 1…MaxAttempts.
func TestRetryAfterCountsTowardGivingUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{BreakerThreshold: 1000}) // the breaker would hold it after 5
	var calls atomic.Int32
	srv := busyForever(&calls)
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}})
	require.NoError(t, err)
	e := b.record(t, events.Event{Type: "a"})[0]
	require.Eventually(t, func() bool { return b.state(t, e.ID, ep.ID) == "cancelled" }, 30*time.Second, 20*time.Millisecond,
		"given up after %d tries", MaxAttempts)
	require.Equal(t, int32(MaxAttempts), calls.Load())
	a := b.attempts(t, ep.ID, MaxAttempts)
	require.Len(t, a, MaxAttempts)
	for i := range a {
		require.Equal(t, i+1, a[i].Attempt)
	}
	got, err := b.wh.Get(ctx, ep.ID)
	require.NoError(t, err)
	require.True(t, got.Enabled, "one given-up delivery does not disable the endpoint")
}

// A delivery is given up after GiveUpAfter, however few tries it had.
func TestGiveUpAfterBoundsTotalTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{GiveUpAfter: 2 * time.Second})
	var calls atomic.Int32
	srv := busyForever(&calls)
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}})
	require.NoError(t, err)
	e := b.record(t, events.Event{Type: "a"})[0]
	require.Eventually(t, func() bool { return b.state(t, e.ID, ep.ID) == "cancelled" }, 20*time.Second, 20*time.Millisecond)
	require.Less(t, calls.Load(), int32(MaxAttempts))
	require.GreaterOrEqual(t, calls.Load(), int32(1))
}

// state is the state of the newest delivery job of an event to an endpoint,
// "" while there is none.
func (b *bundle) state(t *testing.T, event, endpoint uuid.UUID) string {
	t.Helper()
	var state string
	err := b.pool.QueryRow(context.Background(), `SELECT state FROM river_job WHERE kind = 'webhook.deliver'
		AND args->>'event_id' = $1 AND args->>'endpoint_id' = $2 ORDER BY id DESC LIMIT 1`, event.String(), endpoint.String()).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	require.NoError(t, err)
	return state
}
