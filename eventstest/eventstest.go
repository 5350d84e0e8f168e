// Package eventstest helps test code that uses package events, like River's
// rivertest does for River: a real, throwaway PostgreSQL with the library's
// tables, assertions on the events a transaction recorded, and a
// synchronous fan-out for tests that run no goroutines and no LISTEN.
//
// A test binary gets one PostgreSQL server, found or started in this order:
//
//  1. TEST_DATABASE_URL, a URL to a server where the user may create
//     databases;
//  2. a throwaway cluster from the PostgreSQL server binaries on the machine
//     (initdb and postgres on PATH or under /usr/lib/postgresql/*/bin;
//     Debian: apt-get install postgresql), run as the postgres user when the
//     tests run as root;
//  3. a PostgreSQL container through testcontainers-go, when a Docker engine
//     answers;
//
// and otherwise the test fails with a message saying how to provide one. It
// never skips. Every test gets a database of its own, cloned from a template
// migrated once with [events.Outbox.Migrate], so tests can run in parallel. Call
// [Main] from TestMain to remove the server when the tests are done.
//
// This package is the only one of the module that depends on
// testcontainers-go; package events does not.
package eventstest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/pgtest"
	"github.com/standmeet/events/internal/testdb"
)

func init() {
	testdb.Configure(func(ctx context.Context, pool *pgxpool.Pool) error { return events.Outbox{}.Migrate(ctx, pool) })
}

// Main runs the tests and then removes the databases and the throwaway
// server they used. Call it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(eventstest.Main(m)) }
func Main(m *testing.M) int {
	return testdb.Main(m, nil)
}

// Pool returns a pool to a fresh database of its own, migrated with
// [events.Outbox.Migrate] (the default schema), on the test server. The pool is
// closed and the database dropped when t ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return testdb.New(t)
}

// URL is [Pool], for a test that makes its own pools (several "processes"
// on one database): the database's URL, dropped when t ends.
func URL(t testing.TB) string {
	t.Helper()
	return testdb.URL(t)
}

// NewPool is [Pool] for code that has no testing.TB, such as runnable
// examples: close closes the pool and drops the database.
func NewPool(ctx context.Context) (pool *pgxpool.Pool, close func(), err error) {
	url, drop, err := testdb.NewDatabase()
	if err != nil {
		return nil, nil, err
	}
	pool, err = pgxpool.New(ctx, url)
	if err != nil {
		drop()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); drop() }, nil
}

// Postgres is a throwaway PostgreSQL cluster started from the server binaries
// on the machine, for programs (examples, demos) rather than tests. Its data
// lives in a temporary directory, durability is off, and Close removes it.
type Postgres struct {
	c *pgtest.Cluster
}

// StartPostgres starts a throwaway cluster on a free loopback port. It needs
// initdb and postgres on PATH or under /usr/lib/postgresql/*/bin; as root it
// runs them as the postgres user. Nothing is downloaded.
func StartPostgres(ctx context.Context) (*Postgres, error) {
	c, err := pgtest.Start(ctx)
	if err != nil {
		return nil, err
	}
	return &Postgres{c: c}, nil
}

// URL returns a URL to database on the cluster ("postgres" exists).
func (p *Postgres) URL(database string) string { return p.c.URL(database) }

// Close stops the cluster and removes its files.
func (p *Postgres) Close() { p.c.Close() }
