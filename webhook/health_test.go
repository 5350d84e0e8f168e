package webhook

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/testdb"
)

// 1,000 deliveries pending for a dead endpoint: once the breaker opens, the
// endpoint sees about one request per interval, never one per delivery;
// after it recovers the probe closes the breaker and every delivery lands
// once.
func TestBreakerHoldsDeliveriesToADeadEndpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const (
		n        = 1000
		interval = time.Second
	)
	b := setup(t, &Config{BreakerThreshold: 5, BreakerInterval: interval})
	var (
		alive    atomic.Bool
		mu       sync.Mutex
		failures []time.Time
		landed   = map[string]int{}
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if !alive.Load() {
			failures = append(failures, time.Now())
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		landed[r.Header.Get(HeaderID)]++
	}))
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}})
	require.NoError(t, err)
	es := make([]events.Event, n)
	for i := range es {
		es[i] = events.Event{Type: "a", Subject: fmt.Sprint(i)}
	}
	es = b.record(t, es...)

	// Dead for 5 intervals after the breaker opened.
	require.Eventually(t, func() bool {
		h, err := b.wh.Health(ctx, ep.ID)
		require.NoError(t, err)
		return h[0].Breaker == BreakerOpen
	}, 20*time.Second, 10*time.Millisecond)
	mu.Lock()
	opened := len(failures)
	mu.Unlock()
	// Probes keep coming (three of them, however long a busy machine takes:
	// the bound only tells a stall), and no more than one per interval
	// over the time they took.
	start := time.Now()
	probes := func() int { mu.Lock(); defer mu.Unlock(); return len(failures) - opened }
	require.Eventually(t, func() bool { return probes() >= 3 }, 30*time.Second, 10*time.Millisecond, "probes keep coming")
	elapsed, during := time.Since(start), probes()
	t.Logf("%d requests before the breaker opened, %d in the %v after", opened, during, elapsed)
	require.LessOrEqual(t, opened, 5+20, "the threshold, and what was in flight (the client's 20 workers)")
	require.LessOrEqual(t, during, int(elapsed/interval)+2, "one probe per interval")

	h, err := b.wh.Health(ctx, ep.ID)
	require.NoError(t, err)
	require.GreaterOrEqual(t, h[0].ConsecutiveFailures, 5)
	require.Zero(t, h[0].Successes)

	// Recovery: the next probe succeeds, the breaker closes, all land once.
	alive.Store(true)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(landed) == n
	}, 60*time.Second, 50*time.Millisecond, "every delivery lands")
	// Nothing more is on its way: every job is finished.
	require.Eventually(t, func() bool {
		var left int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE kind = 'webhook.deliver' AND finalized_at IS NULL").Scan(&left))
		return left == 0
	}, 30*time.Second, 50*time.Millisecond)
	mu.Lock()
	for _, e := range es {
		require.Equal(t, 1, landed[e.ID.String()], "once: %s", e.ID)
	}
	mu.Unlock()
	h, err = b.wh.Health(ctx, ep.ID)
	require.NoError(t, err)
	require.Equal(t, BreakerClosed, h[0].Breaker)
	require.Equal(t, n, h[0].Successes)
	require.InDelta(t, float64(n)/float64(h[0].Attempts), h[0].SuccessRate, 1e-9)
	require.Positive(t, h[0].LatencyP99)
}

// Two River clients on two pools (two processes) share an endpoint's rate
// limit through PostgreSQL: the endpoint never sees more than the limit
// (within 10 %), and about that much.
func TestRateLimitIsSharedByProcesses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const (
		limit = 20.0
		n     = 120
	)
	b := setup(t, nil)
	var (
		mu    sync.Mutex
		times []time.Time
	)
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
	}))
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}, RateLimit: limit, MaxInFlight: 50})
	require.NoError(t, err)

	// A second process: its own pool, webhooks and River client.
	pool2, err := pgxpool.New(ctx, b.pool.Config().ConnString())
	require.NoError(t, err)
	t.Cleanup(pool2.Close)
	other := &bundle{pool: pool2}
	other.start(t, nil)

	es := make([]events.Event, n)
	for i := range es {
		es[i] = events.Event{Type: "a", Subject: fmt.Sprint(i)}
	}
	b.record(t, es...)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(times) >= n }, 30*time.Second, 20*time.Millisecond)
	mu.Lock()
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	rate := float64(len(times)-1) / times[len(times)-1].Sub(times[0]).Seconds()
	// The worst second: no burst beyond the limit either.
	worst := 0
	for i := range times {
		j := sort.Search(len(times), func(j int) bool { return !times[j].Before(times[i].Add(time.Second)) })
		worst = max(worst, j-i)
	}
	mu.Unlock()
	t.Logf("%.1f requests/s (limit %.0f); at most %d in one second", rate, limit, worst)
	// The limit is a ceiling, shared: never above it by more than 10 %.
	// Reaching it is the machine's business: below half of it only a stall
	// (the suite runs packages side by side on two cores) or a limiter
	// that throttles twice over would be.
	require.LessOrEqual(t, rate, limit*1.1, "%.1f requests/s", rate)
	require.GreaterOrEqual(t, rate, limit*0.5, "%.1f requests/s", rate)
	// Arrivals are timed at the server: when the machine stalls (the suite
	// runs packages side by side on two cores), requests granted on time
	// arrive together (46 in one second at 20/s, once). A limiter that let
	// the deliveries through unthrottled would put most of them in one
	// second; half of them is the bound, and the rate above is the ceiling.
	require.LessOrEqual(t, worst, n/2, "bursts stay within the limit and a stall's worth")

	var clients int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(DISTINCT c) FROM river_job, unnest(attempted_by) AS c
		WHERE kind = 'webhook.deliver' AND args->>'endpoint_id' = $1`, ep.ID.String()).Scan(&clients))
	require.Equal(t, 2, clients, "both processes delivered")
}

// With River's default polling (FetchPollInterval 1 s, the scheduler every
// 5 s), not the 20 ms of the test harness, a rate-limited endpoint still
// gets its limit: a delivery that snoozed for its slot wakes up to a poll
// late, and dropping its slot then (as it did past 500 ms) wasted the slot and
// sends it to the back of the queue, again and again.
func TestRateLimitHoldsWithRiverDefaultPolling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const (
		limit = 10.0
		n     = 60
	)
	pool := testdb.New(t)
	wh, err := New(pool, &Config{AllowedNetworks: loopback, Keys: []Key{testKey("test")}})
	require.NoError(t, err)
	relay, err := events.NewRelay(pool, &events.RelayConfig{Listener: events.ListenerConfig{PollInterval: 50 * time.Millisecond}})
	require.NoError(t, err)
	require.NoError(t, relay.Subscribe(wh.Subscriber("webhooks")))
	workers := river.NewWorkers()
	require.NoError(t, wh.AddWorkers(workers))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Workers: workers,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 20}}})
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	require.NoError(t, relay.Start(ctx, client))
	t.Cleanup(func() {
		stop, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, relay.Stop(stop))
		require.NoError(t, client.Stop(stop))
	})

	var (
		mu    sync.Mutex
		times []time.Time
	)
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
	}))
	defer srv.Close()
	ep, err := wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}, RateLimit: limit, MaxInFlight: 50})
	require.NoError(t, err)
	es := make([]events.Event, n)
	for i := range es {
		es[i] = events.Event{Type: "a", Subject: fmt.Sprint(i)}
	}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := events.RecordMany(ctx, tx, es); return err }))
	// n at the limit take n/limit (6 s); the rate is checked below, this
	// bound only ends a stall.
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(times) >= n }, 60*time.Second,
		50*time.Millisecond, "all %d delivered at about %v/s", n, limit)
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	rate := float64(len(times)-1) / times[len(times)-1].Sub(times[0]).Seconds()
	var reservations int
	require.NoError(t, pool.QueryRow(ctx, `SELECT round(extract(epoch FROM next_slot - $2::timestamptz) * $3)::int FROM webhook_endpoint_health
		WHERE endpoint_id = $1`, ep.ID, times[0], limit).Scan(&reservations))
	t.Logf("%.1f requests/s (limit %.0f); the schedule moved %d slots for %d requests", rate, limit, reservations, n)
	// What broke was slots dropped and reserved again (107 for 60 requests,
	// 5.8/s): the schedule must move about once per request. Counted from the
	// first request, not from the commit: the first delivery waits for a
	// River poll (up to 1 s, ten slots) before any slot is taken. That count
	// is the guard. The rate is a ceiling (20 % over at most: it moves with
	// River's 1 s poll at either end; the two-process test holds the 10 %);
	// below half of the limit only a stall of the busy machine, or a limiter
	// that throttles twice over, would be.
	require.LessOrEqual(t, reservations, n+n/10, "slots wasted: %d reserved for %d requests", reservations, n)
	require.LessOrEqual(t, rate, limit*1.2, "%.1f requests/s", rate)
	require.GreaterOrEqual(t, rate, limit*0.5, "%.1f requests/s", rate)
}

// createAsV010 inserts an endpoint the way 0.1.0's Create does, as a 0.1.0
// process still running during the rolling deploy (migrate first, then roll
// out) does after migration 005: no webhook_endpoint_health row.
func createAsV010(t *testing.T, b *bundle, url string) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	_, err := b.pool.Exec(context.Background(), `INSERT INTO webhook_endpoints
		(id, url, description, types, scopes, headers, secrets, timeout_ms, max_in_flight)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		id, url, "", []string{"**"}, []string{}, map[string]string{}, `[{"secret":"`+NewSecret()+`"}]`, 15000, 10)
	require.NoError(t, err)
	return id
}

// An endpoint created by a 0.1.0 process after migration 005, then given a
// rate limit by the new release, still gets its deliveries.
func TestEndpointCreatedByPreviousReleaseTakesARateLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls.Add(1) }))
	defer srv.Close()
	id := createAsV010(t, b, srv.URL)
	_, err := b.wh.Update(ctx, id, EndpointParams{URL: srv.URL, Types: []string{"**"}, RateLimit: 5})
	require.NoError(t, err)
	e := b.record(t, events.Event{Type: "a"})[0]
	require.Eventually(t, func() bool { return b.state(t, e.ID, id) == "completed" }, 15*time.Second, 10*time.Millisecond,
		"delivered, not failed with \"no rows in result set\"")
	require.Equal(t, int32(1), calls.Load())
}

// An endpoint created by a 0.1.0 process after migration 005 has a circuit
// breaker like any other: its consecutive failures count and open it.
func TestEndpointCreatedByPreviousReleaseHasABreaker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{BreakerThreshold: 2, BreakerInterval: time.Hour})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusInternalServerError) }))
	defer srv.Close()
	id := createAsV010(t, b, srv.URL)
	b.record(t, events.Event{Type: "a"}, events.Event{Type: "b"}, events.Event{Type: "c"})
	b.attempts(t, id, 2)
	require.Eventually(t, func() bool {
		h, err := b.wh.Health(ctx, id)
		require.NoError(t, err)
		return h[0].Breaker == BreakerOpen
	}, 30*time.Second, 10*time.Millisecond, "two failures open the breaker")
}
