package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
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
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/statements"
)

// quietLogger keeps River's and the relay's logs out of test output unless
// EVENTS_TEST_LOG is set.
func quietLogger() *slog.Logger {
	if os.Getenv("EVENTS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// poolInMode opens a pool to url whose queries run in mode.
func poolInMode(t *testing.T, url string, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	return poolWith(t, url, func(c *pgx.ConnConfig) { c.DefaultQueryExecMode = mode })
}

// poolWith opens a pool to url whose connections' config set shapes (a
// tracer, an exec mode), closed when t ends.
func poolWith(t *testing.T, url string, set func(*pgx.ConnConfig)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	set(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// blackholeProxy forwards loopback TCP connections to a PostgreSQL server,
// and on Blackhole makes every connection open at that moment go silent: it
// stops forwarding either way but keeps both sockets open, with no FIN and
// no RST, as a peer that vanished behind a NAT or a failed proxy does.
// Connections made afterwards are forwarded normally.
type blackholeProxy struct {
	ln       net.Listener
	target   string
	accepted atomic.Int32

	mu      sync.Mutex
	gen     int                   // connections of an earlier generation are silenced
	silence map[int]chan struct{} // closed when that generation goes silent
	conns   []net.Conn
	wg      sync.WaitGroup
}

func newBlackholeProxy(t *testing.T, target string) *blackholeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &blackholeProxy{ln: ln, target: target, silence: map[int]chan struct{}{0: make(chan struct{})}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *blackholeProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		silent := p.silence[p.gen]
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		p.wg.Go(func() { pipe(c, up, silent) })
		p.wg.Go(func() { pipe(up, c, silent) })
	}
}

// pipe copies from src to dst until either fails or silent is closed; then it
// holds the sockets open, forwarding nothing.
func pipe(dst, src net.Conn, silent <-chan struct{}) {
	buf := make([]byte, 32<<10)
	for {
		_ = src.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		n, err := src.Read(buf)
		select {
		case <-silent:
			return // what was read is dropped: the wire went dead
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // io.EOF or a reset: the other side closed
		}
	}
}

// Blackhole silences every connection open now.
func (p *blackholeProxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.silence[p.gen])
	p.gen++
	p.silence[p.gen] = make(chan struct{})
}

func (p *blackholeProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// connectVia returns a Listener.Connect that dials the database of dbURL
// through the proxy, with the application name the tests look for.
func (p *blackholeProxy) connectVia(t *testing.T, dbURL, appName string) func(ctx context.Context) (*pgx.Conn, error) {
	_, port, err := net.SplitHostPort(p.ln.Addr().String())
	require.NoError(t, err)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.Host = net.JoinHostPort("127.0.0.1", port)
	cfg, err := pgx.ParseConfig(u.String())
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = appName
	return func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, cfg) }
}

// silenceAll makes every connection of p silent, those open now and those
// accepted from now on (a proxy or load balancer that still accepts TCP but
// no longer reaches the server), until heal.
func (p *blackholeProxy) silenceAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.silence[p.gen])
	p.gen++
	p.silence[p.gen] = make(chan struct{})
	close(p.silence[p.gen]) // new connections are silent from their first byte
}

// heal forwards the connections accepted from now on again.
func (p *blackholeProxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gen++
	p.silence[p.gen] = make(chan struct{})
}

// panicArgs panics in the method named by Panic ("kind", "opts", "marshal").
type panicArgs struct {
	EventID uuid.UUID `json:"event_id"`
	Panic   string    `json:"-"`
}

func (a panicArgs) Kind() string {
	if a.Panic == "kind" {
		panic("panicArgs: Kind panicked")
	}
	return "test.panic"
}

func (a panicArgs) InsertOpts() river.InsertOpts {
	if a.Panic == "opts" {
		panic("panicArgs: InsertOpts panicked")
	}
	return river.InsertOpts{}
}

func (a panicArgs) MarshalJSON() ([]byte, error) {
	if a.Panic == "marshal" {
		panic("panicArgs: MarshalJSON panicked")
	}
	return json.Marshal(map[string]uuid.UUID{"event_id": a.EventID})
}

// panicSub maps events to panicArgs; an event whose subject is "boom-<m>"
// (or whose payload says {"panic":"<m>"}) panics in method m.
func panicSub(name string, ordered, coalesce bool) Subscriber {
	return Subscriber{Name: name, Types: []string{"**"}, Ordered: ordered, Coalesce: coalesce,
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			var p struct {
				Panic string `json:"panic"`
			}
			_ = json.Unmarshal(e.Payload, &p)
			return panicArgs{EventID: e.ID, Panic: p.Panic}, nil, nil
		}}
}

func panicEvent(subject, panicIn string) Event {
	return Event{Type: "a", Subject: subject, Payload: []byte(fmt.Sprintf(`{"panic":%q}`, panicIn))}
}

// fanoutTxOnce runs FanoutTx in a fresh transaction, committed on success,
// and reports a panic as a test failure rather than a crashed binary.
func fanoutTxOnce(t *testing.T, b *testBundle) (n int, err error) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	panicked := !assert.NotPanics(t, func() { n, err = b.relay.FanoutTx(ctx, tx, b.client) }, "FanoutTx panicked")
	if panicked {
		return 0, fmt.Errorf("panicked")
	}
	if err == nil {
		require.NoError(t, tx.Commit(ctx))
	}
	return n, err
}

// poisonAtOnce is a relay config that poisons an event at its first failure.
func poisonAtOnce(onPoison func(context.Context, Event, error)) *RelayConfig {
	return &RelayConfig{MaxAttempts: 1, OnPoison: onPoison}
}

// failingSub fails the mapping of events of type "bad" and maps the others.
func failingSub() Subscriber {
	return Subscriber{Name: "mailer", Types: []string{"**"},
		Map: func(_ context.Context, e Event) (river.JobArgs, *river.InsertOpts, error) {
			if e.Type == "bad" {
				return nil, nil, errors.New("no template")
			}
			return testArgs{EventID: e.ID}, nil, nil
		}}
}

// catchUpPending counts what some subscriber still has to catch up: owed
// pairs, and 0.1.0's catch_up lists.
func catchUpPending(t *testing.T, b *testBundle) int {
	t.Helper()
	return owedCount(t, b.pool)
}

var errRollback = fmt.Errorf("rollback")

// defaultSQL is the statements of the default schema.
func defaultSQL(t *testing.T) *statements.Set {
	t.Helper()
	s, err := statements.For("")
	require.NoError(t, err)
	return s
}

// listenEvents opens a connection of its own that LISTENs on the default
// schema's events channel.
func listenEvents(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	sql, err := statementsFor("")
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{sql.ChannelEvents}.Sanitize())
	require.NoError(t, err)
	return conn
}

// notified waits up to d for a notification on conn.
func notified(conn *pgx.Conn, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_, err := conn.WaitForNotification(ctx)
	return err == nil
}

func requireClosed(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: never closed", what)
	}
}

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// registerOther registers a subscriber as another release's relay would,
// with its type globs, without running it.
func registerOther(t *testing.T, b *testBundle, s Subscriber) {
	t.Helper()
	sub, err := newSubscription(s)
	require.NoError(t, err)
	_, err = registerSubscribers(context.Background(), b.pool, defaultSQL(t), []string{s.Name}, sub)
	require.NoError(t, err)
}

// fannedWithin waits until e is fanned out, failing after d.
func fannedWithin(t *testing.T, b *testBundle, id uuid.UUID, d time.Duration, msg string) time.Duration {
	t.Helper()
	start := time.Now()
	require.Eventually(t, func() bool { return loadRows(t, b.pool)[id].FannedOut }, d, 2*time.Millisecond, msg)
	return time.Since(start)
}

// newRole creates a NOLOGIN role whose name starts with prefix and is this
// test's own (roles are cluster-wide), and returns it quoted for SQL. The
// cleanup hands back what the role owns, drops its grants, then the role.
func newRole(t *testing.T, pool *pgxpool.Pool, prefix string) string {
	t.Helper()
	role := pgx.Identifier{prefix + "_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]}.Sanitize()
	exec(t, pool, "CREATE ROLE "+role+" NOLOGIN")
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = pool.Exec(ctx, "REASSIGN OWNED BY "+role+" TO CURRENT_USER")
		_, _ = pool.Exec(ctx, "DROP OWNED BY "+role)
		_, _ = pool.Exec(ctx, "DROP ROLE "+role)
	})
	return role
}
