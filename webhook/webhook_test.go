package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
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

// outbox is the zero Outbox: the tables on the search_path.
var outbox events.Outbox

func TestMain(m *testing.M) {
	os.Exit(testdb.Main(m, func(ctx context.Context, pool *pgxpool.Pool) error { return outbox.Migrate(ctx, pool) }))
}

var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// bundle is a database with webhooks, a relay and a working River client.
type bundle struct {
	pool   *pgxpool.Pool
	wh     *Webhooks
	client *river.Client[pgx.Tx]
	stop   func() // stops the relay and the client; safe twice
}

func setup(t *testing.T, cfg *Config) *bundle {
	t.Helper()
	b := &bundle{pool: testdb.New(t)}
	b.start(t, cfg)
	return b
}

// start makes the bundle's webhooks, relay and River client from cfg (a
// process starting, with its configuration), stopping those it had.
func (b *bundle) start(t *testing.T, cfg *Config) {
	t.Helper()
	ctx := context.Background()
	if b.stop != nil {
		b.stop()
	}
	if cfg == nil {
		cfg = &Config{}
	}
	if cfg.AllowedNetworks == nil {
		cfg.AllowedNetworks = loopback
	}
	if cfg.Keys == nil && !cfg.PlainSecrets {
		cfg.Keys = []Key{testKey("test")}
	}
	var err error
	b.wh, err = New(b.pool, cfg)
	require.NoError(t, err)
	relay, err := events.NewRelay(b.pool, &events.RelayConfig{Listener: events.ListenerConfig{PollInterval: 50 * time.Millisecond}})
	require.NoError(t, err)
	require.NoError(t, relay.Subscribe(b.wh.Subscriber("webhooks")))
	workers := river.NewWorkers()
	require.NoError(t, b.wh.AddWorkers(workers))
	b.client, err = river.NewClient(riverpgxv5.New(b.pool), &river.Config{Workers: workers,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 20}},
		FetchPollInterval: 20 * time.Millisecond, FetchCooldown: 5 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, b.client.Start(ctx))
	require.NoError(t, relay.Start(ctx, b.client))
	client := b.client
	var once sync.Once
	b.stop = func() {
		once.Do(func() {
			stop, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, relay.Stop(stop))
			require.NoError(t, client.Stop(stop))
		})
	}
	t.Cleanup(b.stop)
}

func (b *bundle) record(t *testing.T, es ...events.Event) []events.Event {
	t.Helper()
	var out []events.Event
	require.NoError(t, pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		var err error
		out, err = events.RecordMany(context.Background(), tx, es)
		return err
	}))
	return out
}

// attempts waits for n attempts of the endpoint and returns them, oldest
// first.
func (b *bundle) attempts(t *testing.T, endpoint uuid.UUID, n int) []Attempt {
	t.Helper()
	var got []Attempt
	require.Eventually(t, func() bool {
		var err error
		got, err = b.wh.Attempts(context.Background(), AttemptFilter{EndpointID: endpoint})
		require.NoError(t, err)
		return len(got) >= n
	}, 20*time.Second, 10*time.Millisecond, "waited for %d attempts", n)
	for i, j := 0, len(got)-1; i < j; i, j = i+1, j-1 {
		got[i], got[j] = got[j], got[i]
	}
	return got
}

// jobState reads the delivery job of an event and an endpoint.
func (b *bundle) job(t *testing.T, event, endpoint uuid.UUID) (id int64, state string, attempt int, scheduled time.Time) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT id, state, attempt, scheduled_at FROM river_job
		WHERE kind = 'webhook.deliver' AND args->>'event_id' = $1 AND args->>'endpoint_id' = $2 ORDER BY id DESC LIMIT 1`,
		event.String(), endpoint.String()).Scan(&id, &state, &attempt, &scheduled))
	return
}

// A delivery carries the Standard Webhooks headers and body, and a receiver
// verifying with an independent implementation of the spec accepts it.
func TestDeliveryIsSignedAndVerifiable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	type received struct {
		header http.Header
		body   []byte
	}
	got := make(chan received, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- received{r.Header.Clone(), body}
	}))
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL + "/hooks", Types: []string{"order.*"}, Headers: map[string]string{"X-Tenant": "acme"}})
	require.NoError(t, err)
	e := b.record(t, events.Event{Type: "order.placed", Subject: "order:1", Payload: []byte(`{"cents":1200}`)})[0]

	var r received
	select {
	case r = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("no delivery")
	}
	require.Equal(t, e.ID.String(), r.header.Get(HeaderID), "the event ID is the idempotency key")
	require.Equal(t, "acme", r.header.Get("X-Tenant"))
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	var ts int64
	_, err = fmt.Sscan(r.header.Get(HeaderTimestamp), &ts)
	require.NoError(t, err)
	require.Equal(t, independentSign(ep.Secrets[0].Secret, e.ID.String(), ts, string(r.body)), r.header.Get(HeaderSignature))
	require.NoError(t, Verify(ep.Secrets[0].Secret, r.header, r.body))
	var bodyDoc struct {
		Type      string          `json:"type"`
		Timestamp time.Time       `json:"timestamp"`
		Data      json.RawMessage `json:"data"`
	}
	require.NoError(t, json.Unmarshal(r.body, &bodyDoc))
	require.Equal(t, "order.placed", bodyDoc.Type)
	require.JSONEq(t, `{"cents":1200}`, string(bodyDoc.Data))
	require.WithinDuration(t, e.CreatedAt, bodyDoc.Timestamp, time.Millisecond)

	a := b.attempts(t, ep.ID, 1)
	require.Equal(t, 200, a[0].Status)
	require.Empty(t, a[0].ErrorClass)
	require.Equal(t, "127.0.0.1", a[0].DialedIP)
}

// A failing receiver, then a healthy one: retried on the schedule (asserted
// on the job, not slept), delivered, the attempt log complete.
func TestFailureIsRetriedOnScheduleThenDelivered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) == 1 {
			http.Error(w, "database is down", http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}})
	require.NoError(t, err)
	e := b.record(t, events.Event{Type: "a"})[0]
	first := b.attempts(t, ep.ID, 1)[0]
	require.Equal(t, "status", first.ErrorClass)
	require.Equal(t, 500, first.Status)
	require.Contains(t, first.Response, "database is down")

	// River keeps the failed job "available" with a future scheduled_at when
	// its retry is due within its scheduler's interval (5 s), "retryable"
	// otherwise.
	var (
		jobID     int64
		state     string
		scheduled time.Time
	)
	require.Eventually(t, func() bool {
		jobID, state, _, scheduled = b.job(t, e.ID, ep.ID)
		return state == "completed" || ((state == "retryable" || state == "available") && scheduled.After(first.CreatedAt.Add(time.Second)))
	}, 30*time.Second, 10*time.Millisecond, "the failed delivery waits for a retry")
	if state != "completed" {
		// 5 s ± 20 % after the attempt, plus the moment River took to record it.
		d := scheduled.Sub(first.CreatedAt)
		require.GreaterOrEqual(t, d, 4*time.Second-50*time.Millisecond, "%v", d)
		require.LessOrEqual(t, d, 8*time.Second, "%v", d)
		_, err = b.pool.Exec(ctx, "UPDATE river_job SET scheduled_at = now() WHERE id = $1 AND state <> 'running'", jobID) // the clock moves on
		require.NoError(t, err)
	}
	a := b.attempts(t, ep.ID, 2)
	require.Empty(t, a[1].ErrorClass)
	require.Equal(t, 2, a[1].Attempt)
	if state == "completed" { // caught after the retry ran: the gap tells the schedule
		gap := a[1].CreatedAt.Sub(a[0].CreatedAt)
		require.GreaterOrEqual(t, gap, 4*time.Second-50*time.Millisecond, "%v", gap)
	}
	require.Eventually(t, func() bool { _, s, _, _ := b.job(t, e.ID, ep.ID); return s == "completed" }, 30*time.Second, 10*time.Millisecond)
	got, err := b.wh.Get(ctx, ep.ID)
	require.NoError(t, err)
	require.True(t, got.FailingSince.IsZero())
	failures, err := b.wh.Attempts(ctx, AttemptFilter{EventID: e.ID, FailuresOnly: true})
	require.NoError(t, err)
	require.Len(t, failures, 1)
}

func TestRetryScheduleAndJitter(t *testing.T) {
	want := []time.Duration{5 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 5 * time.Hour, 10 * time.Hour, 10 * time.Hour}
	for i, d := range want {
		require.Equal(t, d, retryDelay(i+1, 0.5))
		require.Equal(t, time.Duration(float64(d)*0.8), retryDelay(i+1, 0))
		require.Equal(t, time.Duration(float64(d)*1.2), retryDelay(i+1, 1))
	}
	require.Equal(t, 10*time.Hour, retryDelay(99, 0.5))
}

// 410 disables the endpoint and cancels; 429 with Retry-After snoozes; a
// redirect is not followed; a slow receiver times out; a 100 MB answer is
// read only up to the limit.
func TestStatusHandling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	var followed atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("/gone", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusGone) })
	mux.HandleFunc("/busy", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "120")
		w.WriteHeader(http.StatusTooManyRequests)
	})
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/target", http.StatusFound) })
	mux.HandleFunc("/target", func(http.ResponseWriter, *http.Request) { followed.Store(true) })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	mux.HandleFunc("/huge", func(w http.ResponseWriter, r *http.Request) {
		chunk := []byte(strings.Repeat("x", 64<<10))
		for range 100 << 20 / len(chunk) { // 100 MB, until the client hangs up
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	create := func(path string, timeout time.Duration) Endpoint {
		ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL + path, Types: []string{path[1:]}, Timeout: timeout})
		require.NoError(t, err)
		return ep
	}
	gone, busy, moved, slow, huge := create("/gone", 0), create("/busy", 0), create("/moved", 0), create("/slow", 200*time.Millisecond), create("/huge", 0)
	es := b.record(t, events.Event{Type: "gone"}, events.Event{Type: "busy"}, events.Event{Type: "moved"}, events.Event{Type: "slow"}, events.Event{Type: "huge"})

	require.Equal(t, 410, b.attempts(t, gone.ID, 1)[0].Status)
	require.Eventually(t, func() bool { _, s, _, _ := b.job(t, es[0].ID, gone.ID); return s == "cancelled" }, 30*time.Second, 10*time.Millisecond)
	ep, err := b.wh.Get(ctx, gone.ID)
	require.NoError(t, err)
	require.False(t, ep.Enabled)
	require.Contains(t, ep.DisabledReason, "410")

	require.Equal(t, 429, b.attempts(t, busy.ID, 1)[0].Status)
	require.Eventually(t, func() bool {
		_, s, attempt, scheduled := b.job(t, es[1].ID, busy.ID)
		d := time.Until(scheduled)
		return s == "scheduled" && d > 100*time.Second && d <= 120*time.Second && attempt <= 1
	}, 30*time.Second, 10*time.Millisecond, "snoozed for Retry-After")

	a := b.attempts(t, moved.ID, 1)[0]
	require.Equal(t, "redirect", a.ErrorClass)
	require.Equal(t, 302, a.Status)
	require.False(t, followed.Load(), "redirects are not followed")

	a = b.attempts(t, slow.ID, 1)[0]
	require.Equal(t, "timeout", a.ErrorClass)
	require.Less(t, a.Duration, 3*time.Second)

	a = b.attempts(t, huge.ID, 1)[0]
	require.Equal(t, 200, a.Status)
	require.Len(t, a.Response, MaxResponseBytesDefault, "the body is kept up to the limit only")
}

// Registration refuses URLs to forbidden addresses; a DNS name that
// resolves to a private address is refused at dial time, without a
// connection being made.
func TestSSRFGuard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{AllowedNetworks: []netip.Prefix{}})
	for _, u := range []string{"http://127.0.0.1/", "http://[::1]:8080/", "http://169.254.169.254/latest/meta-data/",
		"http://10.1.2.3/", "http://[::ffff:10.0.0.1]/", "http://[64:ff9b::a9fe:a9fe]/", "http://100.64.0.1/", "http://[fd00::1]/",
		"ftp://example.com/", "http://user:pw@example.com/", "http:///nohost"} {
		_, err := b.wh.Create(ctx, EndpointParams{URL: u, Types: []string{"**"}})
		require.ErrorIs(t, err, ErrInvalidEndpoint, u)
	}
	var dialed atomic.Bool
	b.wh.lookup = func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("10.0.0.5")}, nil
	}
	b.wh.clientOnce.Do(func() {
		b.wh.client = b.wh.guard.newClient(b.wh.lookup, func(context.Context, string) { dialed.Store(true) })
	})
	ep, err := b.wh.Create(ctx, EndpointParams{URL: "http://internal.example:8080/", Types: []string{"**"}})
	require.NoError(t, err, "a name is checked when it is resolved")
	b.record(t, events.Event{Type: "a"})
	a := b.attempts(t, ep.ID, 1)[0]
	require.Equal(t, "forbidden_address", a.ErrorClass)
	require.Contains(t, a.Error, "10.0.0.5")
	require.Empty(t, a.DialedIP)
	require.False(t, dialed.Load(), "no connection was made")
}

func TestGuardSeesThroughEmbeddedForms(t *testing.T) {
	g := guard{}
	for _, ip := range []string{"127.0.0.1", "10.0.0.1", "169.254.169.254", "100.64.1.1", "224.0.0.1", "0.0.0.0", "::", "::1",
		"fe80::1", "fc00::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "64:ff9b::7f00:1", "64:ff9b::a00:1"} {
		require.ErrorIs(t, g.check(netip.MustParseAddr(ip)), ErrForbiddenAddress, ip)
	}
	for _, ip := range []string{"93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "64:ff9b::5db8:d822"} {
		require.NoError(t, g.check(netip.MustParseAddr(ip)), ip)
	}
	allowed := guard{allowed: loopback}
	require.NoError(t, allowed.check(netip.MustParseAddr("127.0.0.1")))
	require.NoError(t, allowed.check(netip.MustParseAddr("::ffff:127.0.0.1")))
	require.Error(t, allowed.check(netip.MustParseAddr("10.0.0.1")))
}

// Fan-out by type glob and scope; a fanout job that runs twice (retried
// after a crash) inserts each delivery once.
func TestFanoutByGlobAndScopeOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	var mu sync.Mutex
	got := map[string][]string{} // path -> event types
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var doc struct{ Type string }
		_ = json.NewDecoder(r.Body).Decode(&doc)
		mu.Lock()
		got[r.URL.Path] = append(got[r.URL.Path], doc.Type)
		mu.Unlock()
	}))
	defer srv.Close()
	orders, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL + "/orders", Types: []string{"order.*"}})
	require.NoError(t, err)
	tenant, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL + "/tenant1", Types: []string{"**"}, Scopes: []string{"tenant:1"}})
	require.NoError(t, err)
	es := b.record(t, events.Event{Type: "order.placed", Scope: "tenant:1"}, events.Event{Type: "order.paid", Scope: "tenant:2"},
		events.Event{Type: "note.changed", Scope: "tenant:1"}, events.Event{Type: "note.changed"})
	b.attempts(t, orders.ID, 2)
	b.attempts(t, tenant.ID, 2)
	mu.Lock()
	require.ElementsMatch(t, []string{"order.placed", "order.paid"}, got["/orders"])
	require.ElementsMatch(t, []string{"order.placed", "note.changed"}, got["/tenant1"])
	mu.Unlock()

	// The same event's fanout job again: nothing new.
	_, err = b.client.Insert(ctx, FanoutArgs{Event: es[0]}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var done int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE kind = 'webhook.fanout' AND state = 'completed'").Scan(&done))
		return done == 5
	}, 30*time.Second, 10*time.Millisecond)
	var deliveries int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE kind = 'webhook.deliver' AND args->>'event_id' = $1",
		es[0].ID.String()).Scan(&deliveries))
	require.Equal(t, 2, deliveries, "one per endpoint, however often the fanout runs")
}

// An endpoint failing for longer than AutoDisableAfter is disabled, and the
// library records webhook.endpoint.disabled through the outbox.
func TestAutoDisableRecordsAnEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{AutoDisableAfter: time.Hour})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusInternalServerError) }))
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"order.*"}})
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "UPDATE webhook_endpoints SET failing_since = now() - interval '2 hours' WHERE id = $1", ep.ID)
	require.NoError(t, err)
	e := b.record(t, events.Event{Type: "order.placed"})[0]
	b.attempts(t, ep.ID, 1)
	require.Eventually(t, func() bool { _, s, _, _ := b.job(t, e.ID, ep.ID); return s == "cancelled" }, 30*time.Second, 10*time.Millisecond)
	got, err := b.wh.Get(ctx, ep.ID)
	require.NoError(t, err)
	require.False(t, got.Enabled)
	// One statement, whatever the event's state: listing the fanned-out
	// events and then the pending ones missed it when the relay fanned it
	// out between the two.
	var payloads []string
	rows, err := b.pool.Query(ctx, "SELECT payload::text FROM outbox_events WHERE type = $1", EventEndpointDisabled)
	require.NoError(t, err)
	payloads, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, payloads, 1)
	require.Contains(t, payloads[0], ep.ID.String())
}

// Recover re-delivers exactly the failed deliveries of a time range, after
// the endpoint was fixed; Replay one event to one endpoint.
func TestRecoverAndReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	var healthy atomic.Bool
	var mu sync.Mutex
	delivered := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !healthy.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		mu.Lock()
		delivered[r.Header.Get(HeaderID)]++
		mu.Unlock()
	}))
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}})
	require.NoError(t, err)
	from := time.Now().Add(-time.Minute)
	es := b.record(t, events.Event{Type: "a"}, events.Event{Type: "b"})
	b.attempts(t, ep.ID, 2)
	healthy.Store(true)
	n, err := b.wh.Recover(ctx, b.client, ep.ID, from, time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.Equal(t, 2, n)
	// Both delivered, and their successes logged.
	require.Eventually(t, func() bool {
		ok := map[uuid.UUID]bool{}
		all, err := b.wh.Attempts(ctx, AttemptFilter{EndpointID: ep.ID})
		require.NoError(t, err)
		for _, a := range all {
			ok[a.EventID] = ok[a.EventID] || a.ErrorClass == ""
		}
		return ok[es[0].ID] && ok[es[1].ID]
	}, 20*time.Second, 10*time.Millisecond)
	// Every failure has a success after it: nothing to recover.
	n, err = b.wh.Recover(ctx, b.client, ep.ID, time.Now().Add(-time.Second), time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.Zero(t, n)

	require.NoError(t, b.wh.Replay(ctx, b.client, es[0].ID, ep.ID))
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return delivered[es[0].ID.String()] >= 2
	}, 20*time.Second, 10*time.Millisecond)
	require.ErrorIs(t, b.wh.Replay(ctx, b.client, uuid.Must(uuid.NewV7()), ep.ID), events.ErrNotFound)
}

func TestEndpointAPI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	ep, err := b.wh.Create(ctx, EndpointParams{URL: "https://example.com/a", Types: []string{"order.*"}, Description: "orders"})
	require.NoError(t, err)
	require.True(t, ep.Enabled)
	require.Equal(t, TimeoutDefault, ep.Timeout)
	require.Len(t, ep.Secrets, 1)
	for _, bad := range []EndpointParams{
		{URL: "https://example.com", Types: nil},
		{URL: "https://example.com", Types: []string{"a*"}},
		{URL: "https://example.com", Types: []string{"**"}, Headers: map[string]string{"Host": "x"}},
		{URL: "https://example.com", Types: []string{"**"}, Headers: map[string]string{"webhook-signature": "x"}},
		{URL: "https://example.com", Types: []string{"**"}, Timeout: time.Hour},
	} {
		_, err := b.wh.Create(ctx, bad)
		require.ErrorIs(t, err, ErrInvalidEndpoint, "%+v", bad)
	}
	ep, err = b.wh.Update(ctx, ep.ID, EndpointParams{URL: "https://example.com/b", Types: []string{"**"}, Scopes: []string{"tenant:1"}})
	require.NoError(t, err)
	require.Equal(t, "https://example.com/b", ep.URL)
	newSecret, err := b.wh.RotateSecret(ctx, ep.ID, time.Hour)
	require.NoError(t, err)
	ep, err = b.wh.getForDelivery(ctx, ep.ID)
	require.NoError(t, err)
	active := func(at time.Time) []string {
		secrets, err := b.wh.openSecrets(&ep, at)
		require.NoError(t, err)
		return secrets
	}
	require.Len(t, active(time.Now()), 2, "old and new sign during the grace")
	require.Len(t, active(time.Now().Add(2*time.Hour)), 1, "then only the new")
	require.Equal(t, newSecret, active(time.Now().Add(2 * time.Hour))[0])
	require.NoError(t, b.wh.Disable(ctx, ep.ID, "maintenance"))
	ep, _ = b.wh.Get(ctx, ep.ID)
	require.False(t, ep.Enabled)
	require.Equal(t, "maintenance", ep.DisabledReason)
	require.NoError(t, b.wh.Enable(ctx, ep.ID))
	second, err := b.wh.Create(ctx, EndpointParams{URL: "https://example.com/c", Types: []string{"**"}})
	require.NoError(t, err)
	page, err := b.wh.List(ctx, uuid.Nil, 1)
	require.NoError(t, err)
	require.Len(t, page.Endpoints, 1)
	page, err = b.wh.List(ctx, page.Next, 1)
	require.NoError(t, err)
	require.Equal(t, second.ID, page.Endpoints[0].ID)
	require.NoError(t, b.wh.Delete(ctx, ep.ID))
	_, err = b.wh.Get(ctx, ep.ID)
	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorIs(t, b.wh.Delete(ctx, ep.ID), ErrNotFound)
}

// A refused config field is an *events.ValidationError naming it, as in
// the root package.
func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	for _, c := range []struct {
		cfg   *Config
		field string
	}{
		{&Config{MaxResponseBytes: -1}, "MaxResponseBytes"},
		{&Config{BreakerInterval: -1}, "BreakerInterval"},
		{&Config{AllowedPorts: []int{443, 0}}, "AllowedPorts[1]"},
		{&Config{Keys: []Key{{ID: "k", Key: []byte("short")}}}, "Keys[0].Key"},
		{&Config{Keys: []Key{{ID: "bad id", Key: make([]byte, 32)}}}, "Keys[0].ID"},
		{&Config{Outbox: events.Outbox{Schema: "a-b"}}, "Outbox.Schema"},
	} {
		_, err := New(pool, c.cfg)
		var ve *events.ValidationError
		require.ErrorAs(t, err, &ve, c.field)
		require.ErrorIs(t, err, events.ErrInvalidConfig, c.field)
		require.Equal(t, c.field, ve.Field)
	}
	_, err := New(nil, nil)
	require.ErrorIs(t, err, events.ErrInvalidConfig)
}
