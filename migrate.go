package events

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/standmeet/events/internal/backoff"
	"github.com/standmeet/events/internal/statements"
	"github.com/standmeet/events/migrations"
)

// migrateLockKey is the advisory lock that serialises Migrate across processes.
const migrateLockKey = 7_365_109_225_001

// Migrate brings River's tables (with River's migrator, one transaction per
// version, as River requires) and then the library's tables (one transaction
// per version) up to date. It is idempotent, and safe to call from several
// processes at once: every transaction takes a transaction-level advisory
// lock, so they take turns and the later ones find nothing left to do. It
// works through a transaction-pooling proxy such as PgBouncer.
//
// It runs while the service writes: no step of the library's holds a lock
// that blocks [Record] for longer than an instant, and a step that must wait
// for a lock (behind a long transaction) gives up after half a second and
// tries again, rather than queue every writer behind it. An index on a
// busy table is built concurrently, outside a transaction: that build waits
// for the transactions running when it starts (ctx bounds the wait), and
// blocks no writer meanwhile. Run it before
// rolling out a new release (see the README's "Upgrading the library"): the
// previous release keeps working on the migrated schema.
//
// River's tables and the library's go into o's Schema, created if missing;
// the zero Outbox puts them where the connection's search_path does, as
// River does.
func (o Outbox) Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return migrate(ctx, pool, o, 0)
}

// migrateLockTimeout bounds how long one step of [Outbox.Migrate] waits for a lock
// before it rolls back and tries again (up to migrateLockTries times), so
// that writers never queue behind a waiting migration for longer.
const migrateLockTimeout = 500 * time.Millisecond

const migrateLockTries = 20

// migrate is Migrate up to version to (0: all), for tests that need an
// earlier release's schema.
func migrate(ctx context.Context, pool *pgxpool.Pool, o Outbox, to int) error {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: o.Schema})
	if err != nil {
		return fmt.Errorf("events: migrate: %w", err)
	}
	files, err := loadMigrations()
	if err != nil {
		return err
	}
	step, err := migrationTx(ctx, pool, sql)
	if err != nil {
		return err
	}
	if err := migrateRiver(ctx, step, migrator); err != nil {
		return err
	}
	for _, m := range files {
		if to > 0 && m.version > to {
			break
		}
		apply := migrateStep
		if m.outsideTx {
			apply = func(ctx context.Context, sql *statements.Set, step func(func(pgx.Tx) error) error, m migrationFile) error {
				return migrateOutsideTx(ctx, pool, sql, step, m)
			}
		}
		if err := apply(ctx, sql, step, m); err != nil {
			return err
		}
	}
	// The SQL functions notify the schema's own channel.
	return step(func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sql.SetChannel, sql.ChannelEvents); err != nil {
			return fmt.Errorf("events: migrate: settings: %w", err)
		}
		return nil
	})
}

// migrationTx returns what runs each step of [Outbox.Migrate] in a READ
// COMMITTED transaction of its own, in sql's schema (created if missing). Every transaction takes the
// migration lock first, a transaction-level advisory lock, so Migrate works
// through a transaction-pooling proxy (PgBouncer): a session lock would stay
// with whichever server connection took it.
func migrationTx(ctx context.Context, pool *pgxpool.Pool, sql *statements.Set) (func(func(pgx.Tx) error) error, error) {
	schema := pgx.Identifier{sql.Schema}.Sanitize()
	createSchema, err := statements.Render(sql.CreateSchema, map[string]string{"schema_name": schema})
	if err != nil {
		return nil, err
	}
	return func(f func(tx pgx.Tx) error) error {
		// READ COMMITTED whatever the database's default: a step that waits
		// for a lock must see what committed while it waited (020 drops
		// the outbox table if it is empty once locked).
		return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sql.MigrateLock, int64(migrateLockKey)); err != nil {
				return fmt.Errorf("events: migrate: taking the migration lock: %w", err)
			}
			if sql.Schema != "" {
				if _, err := tx.Exec(ctx, createSchema); err != nil {
					return fmt.Errorf("events: migrate: schema %s: %w", sql.Schema, err)
				}
				if _, err := tx.Exec(ctx, sql.SetLocal, "search_path", schema); err != nil {
					return fmt.Errorf("events: migrate: schema %s: %w", sql.Schema, err)
				}
			}
			return f(tx)
		})
	}, nil
}

// migrateRiver applies River's migrations one per transaction, as River
// requires: a later one uses an enum value an earlier one adds, which only a
// commit makes usable. (The library's run one per transaction too, each
// holding its locks only as long as it runs.)
func migrateRiver(ctx context.Context, step func(func(pgx.Tx) error) error, migrator *rivermigrate.Migrator[pgx.Tx]) error {
	for {
		var applied int
		err := step(func(tx pgx.Tx) error {
			//nolint:staticcheck // MigrateTx is deprecated for batching versions in one transaction; this applies one.
			res, err := migrator.MigrateTx(ctx, tx, rivermigrate.DirectionUp, &rivermigrate.MigrateOpts{MaxSteps: 1})
			if err != nil {
				return fmt.Errorf("events: migrate: River: %w", err)
			}
			applied = len(res.Versions)
			return nil
		})
		if err != nil || applied == 0 {
			return err
		}
	}
}

// migrateStep applies m unless the database has it, in one transaction whose
// lock waits are bounded by migrateLockTimeout; a step that timed out is
// retried after a pause.
func migrateStep(ctx context.Context, sql *statements.Set, step func(func(pgx.Tx) error) error, m migrationFile) error {
	for try := 1; ; try++ {
		err := step(func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sql.CreateMigrationTable); err != nil {
				return fmt.Errorf("events: migrate: %w", err)
			}
			// Each version the database lacks is applied, not only those above
			// its highest: versions may land out of number order (008 before
			// 007), and one applied later must not be skipped.
			var have []int
			if err := tx.QueryRow(ctx, sql.MigrationVersions).Scan(&have); err != nil {
				return fmt.Errorf("events: migrate: %w", err)
			}
			if slices.Contains(have, m.version) {
				return nil
			}
			if _, err := tx.Exec(ctx, sql.SetLocal, "lock_timeout", strconv.FormatInt(migrateLockTimeout.Milliseconds(), 10)); err != nil {
				return fmt.Errorf("events: migrate: %w", err)
			}
			if _, err := tx.Exec(ctx, m.up); err != nil {
				return fmt.Errorf("events: migrate: version %d: %w", m.version, err)
			}
			if _, err := tx.Exec(ctx, sql.MigrationApplied, m.version); err != nil {
				return fmt.Errorf("events: migrate: version %d: %w", m.version, err)
			}
			return nil
		})
		var pgErr *pgconn.PgError
		if err == nil || try == migrateLockTries || !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.LockNotAvailable {
			return err
		}
		if err := backoff.Sleep(ctx, backoff.Delay(try, 100*time.Millisecond, 2*time.Second)); err != nil {
			return err
		}
	}
}

type migrationFile struct {
	version  int
	name     string
	up, down string
	// outsideTx: the up file builds one index concurrently, outside any
	// transaction (see migrateOutsideTx). Its first line says so.
	outsideTx bool
}

// outsideTxMarker is the first line of a migration that runs outside a
// transaction.
const outsideTxMarker = "-- events: outside a transaction"

// migrateOutsideTx applies m, a CREATE INDEX CONCURRENTLY, unless the
// database has it: the version is checked and recorded in steps (under the
// migration lock), and the index is built between them on a connection of
// its own, outside any transaction, so that writers never wait for the
// build. The build waits for the transactions running when it starts (a
// held snapshot included) without blocking anyone; ctx bounds that wait.
//
// Several processes may migrate at once, and a build may be cut short (its
// ctx ended, its connection dropped), leaving an invalid index. So the
// index is built until it is valid: one being built by another process is
// waited for; an invalid one that nobody builds is dropped and built again.
func migrateOutsideTx(ctx context.Context, pool *pgxpool.Pool, sql *statements.Set, step func(func(pgx.Tx) error) error, m migrationFile) error {
	applied := func(tx pgx.Tx) (bool, error) {
		if _, err := tx.Exec(ctx, sql.CreateMigrationTable); err != nil {
			return false, fmt.Errorf("events: migrate: %w", err)
		}
		var have []int
		if err := tx.QueryRow(ctx, sql.MigrationVersions).Scan(&have); err != nil {
			return false, fmt.Errorf("events: migrate: %w", err)
		}
		return slices.Contains(have, m.version), nil
	}
	var done bool
	if err := step(func(tx pgx.Tx) (err error) { done, err = applied(tx); return err }); err != nil || done {
		return err
	}
	name, create, err := concurrentIndex(sql.Schema, m.up)
	if err != nil {
		return fmt.Errorf("events: migrate: version %d: %w", m.version, err)
	}
	// Two processes' builds (or a build and a drop) may wait for each
	// other: one is chosen as a deadlock's victim, or finds the other's
	// catalog row. Either looks again, after a pause of its own.
	raced := func(err error) bool {
		var pgErr *pgconn.PgError
		return errors.As(err, &pgErr) && (pgErr.Code == pgerrcode.UniqueViolation || pgErr.Code == pgerrcode.DuplicateTable ||
			pgErr.Code == pgerrcode.DeadlockDetected)
	}
	for try := 1; ; try++ {
		var valid, building bool
		err := pool.QueryRow(ctx, sql.IndexState, name).Scan(&valid, &building)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			// Another process may have built it, recorded the version and
			// gone on to later versions that moved the table on (020
			// partitions it, and drops the index with the empty table).
			if err = step(func(tx pgx.Tx) (err error) { done, err = applied(tx); return err }); err != nil || done {
				return err
			}
			if _, err = pool.Exec(ctx, create); raced(err) {
				err = backoff.Sleep(ctx, backoff.Delay(try, 100*time.Millisecond, 2*time.Second))
			}
		case err != nil:
		case valid:
			return step(func(tx pgx.Tx) error {
				done, err := applied(tx)
				if err != nil || done {
					return err
				}
				if _, err := tx.Exec(ctx, sql.MigrationApplied, m.version); err != nil {
					return fmt.Errorf("events: migrate: version %d: %w", m.version, err)
				}
				return nil
			})
		case building:
			err = backoff.Sleep(ctx, time.Second)
		default: // invalid, and nobody builds it: a build cut short
			if _, err = pool.Exec(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+name); raced(err) {
				err = backoff.Sleep(ctx, backoff.Delay(try, 100*time.Millisecond, 2*time.Second))
			}
		}
		if err != nil {
			// Another process may have finished this version between our look
			// and our statement, and gone on to later versions that moved the
			// table on (after 020 a concurrent build on the partitioned table
			// fails): what it recorded is done, not a failure.
			if stepErr := step(func(tx pgx.Tx) (err error) { done, err = applied(tx); return err }); stepErr == nil && done {
				return nil
			}
			return fmt.Errorf("events: migrate: version %d: %w", m.version, err)
		}
	}
}

// concurrentIndex reads an outside-a-transaction migration: the index's name
// (qualified with schema) and its CREATE INDEX CONCURRENTLY statement, with
// its table qualified too (no search_path is set outside a transaction: a
// transaction-pooling proxy would not keep it).
func concurrentIndex(schema, up string) (name, create string, err error) {
	const prefix = "CREATE INDEX CONCURRENTLY IF NOT EXISTS "
	i := strings.Index(up, prefix)
	if i < 0 {
		return "", "", errors.New("no CREATE INDEX CONCURRENTLY IF NOT EXISTS statement")
	}
	name, _, _ = strings.Cut(up[i+len(prefix):], " ")
	qualifier := ""
	if schema != "" {
		qualifier = pgx.Identifier{schema}.Sanitize() + "."
		name = qualifier + name
	}
	return name, strings.ReplaceAll(up[i:], "/* schema */", qualifier), nil
}

// loadMigrations reads migrations.FS into versions, in order.
func loadMigrations() ([]migrationFile, error) {
	entries, err := fs.ReadDir(migrations.FS, ".")
	if err != nil {
		return nil, fmt.Errorf("events: migrate: %w", err)
	}
	byVersion := map[int]*migrationFile{}
	for _, e := range entries {
		name := e.Name()
		numStr, rest, ok := strings.Cut(name, "_")
		if !ok || !strings.HasSuffix(name, ".sql") {
			continue
		}
		version, err := strconv.Atoi(numStr)
		if err != nil {
			return nil, fmt.Errorf("events: migrate: bad migration file name %q", name)
		}
		body, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			return nil, fmt.Errorf("events: migrate: %w", err)
		}
		m := byVersion[version]
		if m == nil {
			m = &migrationFile{version: version, name: strings.TrimSuffix(strings.TrimSuffix(rest, ".up.sql"), ".down.sql")}
			byVersion[version] = m
		}
		switch {
		case strings.HasSuffix(name, ".up.sql"):
			m.up = string(body)
			m.outsideTx = strings.HasPrefix(m.up, outsideTxMarker+"\n")
		case strings.HasSuffix(name, ".down.sql"):
			m.down = string(body)
		}
	}
	out := make([]migrationFile, 0, len(byVersion))
	for _, m := range byVersion {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// MigrationInfo is one migration, as [Outbox.ListMigrations] reports it.
type MigrationInfo struct {
	// Line is "river" (River's own tables) or "events" (this library's).
	Line    string
	Version int
	Name    string
	// Applied reports whether the database has it.
	Applied bool
	// SQL is the migration's up SQL, to review before applying.
	SQL string
}

// ListMigrations lists River's migrations and the library's, in the order
// [Outbox.Migrate] applies them, each with whether the database has it. It
// changes nothing: it is what `events migrate --dry-run` and `events migrate
// list` print.
func (o Outbox) ListMigrations(ctx context.Context, pool *pgxpool.Pool) ([]MigrationInfo, error) {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return nil, err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: o.Schema})
	if err != nil {
		return nil, fmt.Errorf("events: migration status: %w", err)
	}
	var out []MigrationInfo
	applied := map[int]bool{}
	var exists bool
	if err := pool.QueryRow(ctx, sql.RelationExists, schemaTable(o.Schema, "river_migration")).Scan(&exists); err != nil {
		return nil, fmt.Errorf("events: migration status: %w", err)
	}
	if exists {
		existing, err := migrator.ExistingVersions(ctx)
		if err != nil {
			return nil, fmt.Errorf("events: migration status: River: %w", err)
		}
		for _, m := range existing {
			applied[m.Version] = true
		}
	}
	for _, m := range migrator.AllVersions() {
		out = append(out, MigrationInfo{Line: "river", Version: m.Version, Name: m.Name, Applied: applied[m.Version], SQL: m.SQLUp})
	}
	files, err := loadMigrations()
	if err != nil {
		return nil, err
	}
	var have []int
	if err := pool.QueryRow(ctx, sql.RelationExists, schemaTable(o.Schema, "outbox_migration")).Scan(&exists); err != nil {
		return nil, fmt.Errorf("events: migration status: %w", err)
	}
	if exists {
		if err := pool.QueryRow(ctx, sql.MigrationVersions).Scan(&have); err != nil {
			return nil, fmt.Errorf("events: migration status: %w", err)
		}
	}
	for _, f := range files {
		out = append(out, MigrationInfo{Line: "events", Version: f.version, Name: f.name, Applied: slices.Contains(have, f.version), SQL: f.up})
	}
	return out, nil
}

// schemaTable is a table's name in schema, quoted, or bare for "": a value
// for to_regclass.
func schemaTable(schema, table string) string {
	if schema == "" {
		return table
	}
	return pgx.Identifier{schema, table}.Sanitize()
}
