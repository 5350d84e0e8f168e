// Package testdb gives every test its own freshly migrated PostgreSQL
// database, on a real server, found or started in this order:
//
//  1. TEST_DATABASE_URL, a URL to a server where the user may create
//     databases;
//  2. a throwaway cluster from the PostgreSQL server binaries on the machine
//     (see package pgtest), started once per test binary;
//  3. a PostgreSQL container through testcontainers-go, when a Docker engine
//     answers;
//
// and otherwise the tests fail, saying how to provide one. They never skip.
//
// Databases are cloned from a template migrated once per binary, so tests can
// run in parallel. Everything is removed when the binary exits.
package testdb

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/standmeet/events/internal/pgtest"
)

// MigrateFunc prepares an empty database (the template).
type MigrateFunc func(ctx context.Context, pool *pgxpool.Pool) error

var (
	migrate    MigrateFunc
	adminURL   string // a URL to the server's maintenance database
	admin      *pgxpool.Pool
	template   string
	counter    atomic.Int64
	cleanups   []func()
	cleanupsMu sync.Mutex
	setupErr   error
	once       sync.Once
)

// Main runs the tests of a package against a real PostgreSQL prepared by
// migrate, then removes what it created and checks that no goroutine leaked.
// Call it from TestMain: os.Exit(testdb.Main(m, migrate)).
func Main(m *testing.M, fn MigrateFunc) int {
	if fn != nil {
		migrate = fn
	}
	code := m.Run()
	cleanupsMu.Lock()
	defer cleanupsMu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	return code
}

// Configure sets the function that migrates the template, for callers that
// do not run Main (package eventstest). The first one set wins; it must be
// called before the first database is made.
func Configure(fn MigrateFunc) {
	configureMu.Lock()
	defer configureMu.Unlock()
	if migrate == nil {
		migrate = fn
	}
}

var configureMu sync.Mutex

func setup() error {
	once.Do(func() { setupErr = doSetup(context.Background()) })
	return setupErr
}

func doSetup(ctx context.Context) error {
	switch {
	case os.Getenv("TEST_DATABASE_URL") != "":
		adminURL = os.Getenv("TEST_DATABASE_URL")
	default:
		c, err := pgtest.Start(ctx)
		if err == nil {
			AtExit(c.Close)
			adminURL = c.URL("postgres")
			break
		}
		url, dockerErr := startContainer(ctx)
		if dockerErr != nil {
			return fmt.Errorf("testdb: no PostgreSQL for the tests.\n"+
				"  TEST_DATABASE_URL is not set;\n"+
				"  local server binaries: %v;\n"+
				"  Docker: %v.\n"+
				"Provide one: install the server (Debian: apt-get install postgresql), "+
				"or run a Docker engine, or set TEST_DATABASE_URL=postgres://user@host:5432/postgres", err, dockerErr)
		}
		adminURL = url
	}
	var err error
	if admin, err = pgxpool.New(ctx, adminURL); err != nil {
		return fmt.Errorf("testdb: %w", err)
	}
	AtExit(admin.Close)
	template = fmt.Sprintf("events_tmpl_%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{template}.Sanitize()); err != nil {
		return fmt.Errorf("testdb: creating the template database: %w", err)
	}
	AtExit(func() { dropDatabase(template) })
	pool, err := pgxpool.New(ctx, WithDatabase(adminURL, template))
	if err != nil {
		return fmt.Errorf("testdb: %w", err)
	}
	defer pool.Close()
	if migrate != nil {
		if err := migrate(ctx, pool); err != nil {
			return fmt.Errorf("testdb: migrating the template: %w", err)
		}
	}
	return nil
}

// startContainer runs PostgreSQL in Docker, if an engine answers.
func startContainer(ctx context.Context) (url string, err error) {
	defer func() {
		// testcontainers panics in some set-ups without an engine.
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	if _, err := testcontainers.NewDockerClientWithOpts(ctx); err != nil {
		return "", err
	}
	c, err := tcpostgres.Run(ctx, "postgres:16-alpine",
		tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		testcontainers.WithWaitStrategy(wait.ForListeningPort("5432/tcp").WithStartupTimeout(60*time.Second)))
	if err != nil {
		return "", err
	}
	AtExit(func() { _ = testcontainers.TerminateContainer(c) })
	return c.ConnectionString(ctx, "sslmode=disable")
}

// New creates a database for t from the migrated template and returns a pool
// to it, closed and dropped when t ends.
func New(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return newPool(t, URL(t))
}

// URL creates a database for t from the migrated template and returns its
// URL; the database is dropped when t ends.
func URL(t testing.TB) string {
	t.Helper()
	url, drop, err := NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	return url
}

// NewDatabase creates a database from the migrated template, for code that
// has no testing.TB (runnable examples). drop removes it; whatever is not
// dropped goes when the test binary's server does.
func NewDatabase() (url string, drop func(), err error) {
	if err := setup(); err != nil {
		return "", nil, err
	}
	name := fmt.Sprintf("%s_t%d", template, counter.Add(1))
	if _, err := admin.Exec(context.Background(),
		"CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{template}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("testdb: creating %s: %w", name, err)
	}
	return WithDatabase(adminURL, name), func() { dropDatabase(name) }, nil
}

func newPool(t testing.TB, dbURL string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Pool returns another pool to the same database as dbURL (a second
// "process"), closed when t ends.
func Pool(t testing.TB, dbURL string) *pgxpool.Pool {
	t.Helper()
	return newPool(t, dbURL)
}

func dropDatabase(name string) {
	if admin == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// WithDatabase returns dbURL pointing at another database.
func WithDatabase(dbURL, database string) string { return pgtest.WithDatabase(dbURL, database) }

// Cluster is a throwaway server of a test's own, for tests that stop and
// restart the database under a running application.
type Cluster struct {
	*pgtest.Cluster
	// URL is a migrated database on the cluster.
	URL string
}

// NewCluster starts a cluster for t alone, with one database migrated like
// the template. It needs the server binaries (TEST_DATABASE_URL and Docker
// cannot be restarted from a test). It is removed when t ends.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	return newCluster(t, pgtest.Start)
}

// NewDurableCluster is NewCluster with production durability (fsync and
// synchronous_commit on), for tests that rely on what a commit promises:
// replication and failover.
func NewDurableCluster(t testing.TB) *Cluster {
	t.Helper()
	return newCluster(t, pgtest.StartDurable)
}

func newCluster(t testing.TB, start func(context.Context) (*pgtest.Cluster, error)) *Cluster {
	t.Helper()
	ctx := context.Background()
	c, err := start(ctx)
	if err != nil {
		t.Fatalf("testdb: this test restarts PostgreSQL and needs its own throwaway server: %v", err)
	}
	t.Cleanup(c.Close)
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE events")
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, c.URL("events"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if migrate != nil {
		if err := migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	return &Cluster{Cluster: c, URL: c.URL("events")}
}

// EmptyURL creates an empty database (not migrated) for t and returns its
// URL; it is dropped when t ends.
func EmptyURL(t testing.TB) string {
	t.Helper()
	if err := setup(); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("%s_e%d", template, counter.Add(1))
	if _, err := admin.Exec(context.Background(), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("testdb: creating %s: %v", name, err)
	}
	t.Cleanup(func() { dropDatabase(name) })
	return WithDatabase(adminURL, name)
}

// AdminURL returns a URL to the test server's maintenance database, for code
// that creates databases of its own (the benchmark's smoke test).
func AdminURL(t testing.TB) string {
	t.Helper()
	if err := setup(); err != nil {
		t.Fatal(err)
	}
	return adminURL
}

// AtExit registers f to run when the test binary's tests are done, before the
// server is removed: for state shared across tests, such as a fuzz target's
// pool.
func AtExit(f func()) {
	cleanupsMu.Lock()
	defer cleanupsMu.Unlock()
	cleanups = append(cleanups, f)
}

var (
	bouncer     *pgtest.PgBouncer
	bouncerErr  error
	bouncerOnce sync.Once
)

// PgBouncer returns the test binary's PgBouncer, in transaction pooling mode
// in front of the test server (started on first use, removed at exit). Use
// its URL method on a URL from URL or EmptyURL. Without the pgbouncer binary
// the test fails, saying how to install it.
func PgBouncer(t testing.TB) *pgtest.PgBouncer {
	t.Helper()
	if err := setup(); err != nil {
		t.Fatal(err)
	}
	bouncerOnce.Do(func() {
		bouncer, bouncerErr = pgtest.StartPgBouncer(context.Background(), adminURL)
		if bouncerErr == nil {
			AtExit(bouncer.Close)
		}
	})
	if bouncerErr != nil {
		t.Fatalf("testdb: this test needs PgBouncer: %v", bouncerErr)
	}
	return bouncer
}
