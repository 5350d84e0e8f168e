package listener

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/standmeet/events/internal/testdb"
)

// TestMain runs the tests against a real PostgreSQL (no migration: a
// listener needs no tables) and fails if a Run left a goroutine behind.
func TestMain(m *testing.M) {
	code := testdb.Main(m, nil)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "leaked goroutines:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Bounds that only catch a stall: each wait normally ends in milliseconds.
const (
	stall = 30 * time.Second
	tick  = 10 * time.Millisecond
)

// note is a notification as the handler saw it.
type note struct{ channel, payload string }

// bundle is a listener on a database of its own, and what a test needs to
// drive it.
type bundle struct {
	pool     *pgxpool.Pool
	l        *Listener
	notes    chan note // what OnNotify got
	connects chan bool // OnConnect's reconnect argument, per session
}

// setup builds a listener on channel "ch" of a new database; it does not run
// it. app tags its connection in pg_stat_activity.
func setup(t *testing.T, app string) *bundle {
	t.Helper()
	url := testdb.URL(t)
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	b := &bundle{pool: testdb.Pool(t, url), notes: make(chan note, 16), connects: make(chan bool, 16)}
	b.l = &Listener{
		ConnConfig:      cfg,
		Channels:        []string{"ch"},
		ApplicationName: app,
		// The handlers never block Run: a test that stopped reading must
		// not hold the listener (and leak its goroutine).
		OnNotify: func(channel, payload string) {
			select {
			case b.notes <- note{channel, payload}:
			default:
			}
		},
		OnConnect: func(reconnect bool) {
			select {
			case b.connects <- reconnect:
			default:
			}
		},
		Logger:       slog.New(slog.DiscardHandler),
		ReconnectMin: 10 * time.Millisecond,
		ReconnectMax: 100 * time.Millisecond,
	}
	return b
}

// run runs the listener until the returned stop is called (or t ends);
// stop cancels Run's context and waits for Run to return.
func (b *bundle) run(t *testing.T) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.l.Run(ctx)
	}()
	stop = func() {
		t.Helper()
		cancel()
		select {
		case <-done:
		case <-time.After(stall):
			t.Fatal("Run did not return after its context was cancelled")
		}
	}
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return stop
}

// waitListening waits until LISTEN is in effect.
func (b *bundle) waitListening(t *testing.T) {
	t.Helper()
	require.Eventually(t, b.l.Listening, stall, tick, "the listener never started listening")
}

// notify sends payload on "ch" and waits for the handler to get it.
func (b *bundle) notify(t *testing.T, payload string) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), "SELECT pg_notify('ch', $1)", payload)
	require.NoError(t, err)
	select {
	case n := <-b.notes:
		require.Equal(t, note{"ch", payload}, n)
	case <-time.After(stall):
		t.Fatalf("the handler never got %q", payload)
	}
}

// backend returns the PID of the listening connection, found by its
// application name in the test's database.
func (b *bundle) backend(t *testing.T) int {
	t.Helper()
	var pid int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()",
		b.l.ApplicationName).Scan(&pid))
	return pid
}

func TestListenerDeliversANotificationToTheHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, "listener_test_delivers")
	b.run(t)
	b.waitListening(t)
	b.notify(t, "hello")
	b.notify(t, "again")
}

// Listening is false before Run, turns true once LISTEN is in effect (so a
// NOTIFY sent from then on is delivered), and is false again after Run
// returns.
func TestListenerListeningFollowsTheSession(t *testing.T) {
	t.Parallel()
	b := setup(t, "listener_test_listening")
	require.False(t, b.l.Listening(), "listening before Run")
	stop := b.run(t)
	b.waitListening(t)
	require.False(t, <-b.connects, "the first session is not a reconnect")
	b.notify(t, "listening")
	stop()
	require.False(t, b.l.Listening(), "listening after Run returned")
}

// A listening backend terminated by the server (a failover, an operator's
// pg_terminate_backend) is replaced: the listener dials again, says it
// reconnected, and delivers the notifications sent after that.
func TestListenerReconnectsAfterItsBackendIsTerminated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, "listener_test_reconnects")
	b.run(t)
	b.waitListening(t)
	require.False(t, <-b.connects, "the first session is not a reconnect")
	b.notify(t, "before")
	old := b.backend(t)

	var terminated bool
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", old).Scan(&terminated))
	require.True(t, terminated)
	select {
	case reconnect := <-b.connects:
		require.True(t, reconnect, "the second session says it is a reconnect")
	case <-time.After(stall):
		t.Fatal("the listener never connected again")
	}
	b.waitListening(t)
	require.NotEqual(t, old, b.backend(t), "the listening backend was not replaced")
	b.notify(t, "after")
}

// Run returns once its context is cancelled, while listening and while
// waiting to reconnect, and leaves no goroutine behind (TestMain checks).
func TestListenerRunReturnsWhenItsContextIsCancelled(t *testing.T) {
	t.Parallel()
	t.Run("listening", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "listener_test_stop_listening")
		stop := b.run(t)
		b.waitListening(t)
		stop()
		require.False(t, b.l.Listening())
	})
	t.Run("reconnecting", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "listener_test_stop_reconnecting")
		// A server that refuses every attempt: Run retries, with backoff,
		// until it is stopped.
		attempts := make(chan struct{}, 16)
		b.l.Connect = func(context.Context) (*pgx.Conn, error) {
			select {
			case attempts <- struct{}{}:
			default:
			}
			return nil, fmt.Errorf("refused")
		}
		stop := b.run(t)
		for range 2 {
			select {
			case <-attempts:
			case <-time.After(stall):
				t.Fatal("the listener stopped dialling")
			}
		}
		stop()
		require.False(t, b.l.Listening())
	})
}
