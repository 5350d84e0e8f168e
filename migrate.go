package events

import (
	"context"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/standmeet/events/migrations"
)

// MigrateOpts configures [Migrate].
type MigrateOpts struct {
	// Schema is the PostgreSQL schema that holds the library's and River's
	// tables. It is created if missing.
	//
	// Defaults to empty: tables go where the connection's search_path puts
	// them, as with River.
	Schema string
}

// migrateLockKey is the advisory lock that serialises Migrate across processes.
const migrateLockKey = 7_365_109_225_001

// Migrate brings River's tables (with River's migrator, one transaction per
// version, as River requires) and then the library's tables (in one
// transaction) up to date. It is idempotent, and safe to call from several
// processes at once: they take turns on an advisory lock, and the later ones
// find nothing left to do.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts *MigrateOpts) error {
	if opts == nil {
		opts = &MigrateOpts{}
	}
	sql, err := statementsFor(opts.Schema)
	if err != nil {
		return err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: opts.Schema})
	if err != nil {
		return fmt.Errorf("events: migrate: %w", err)
	}
	files, err := loadMigrations()
	if err != nil {
		return err
	}
	// River's migrations must run one transaction each (a later one uses an
	// enum value an earlier one adds), so the lock is a session lock held on
	// a connection of its own while River migrates, then ours run.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("events: migrate: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(migrateLockKey)); err != nil {
		return fmt.Errorf("events: migrate: taking the migration lock: %w", err)
	}
	defer func() {
		// A lost connection has released the lock already.
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", int64(migrateLockKey))
	}()
	if opts.Schema != "" {
		if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{opts.Schema}.Sanitize()); err != nil {
			return fmt.Errorf("events: migrate: schema %s: %w", opts.Schema, err)
		}
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("events: migrate: River: %w", err)
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if opts.Schema != "" {
			if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+pgx.Identifier{opts.Schema}.Sanitize()); err != nil {
				return fmt.Errorf("events: migrate: schema %s: %w", opts.Schema, err)
			}
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS outbox_migration (
			version    integer     PRIMARY KEY,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("events: migrate: %w", err)
		}
		var current int
		if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM outbox_migration").Scan(&current); err != nil {
			return fmt.Errorf("events: migrate: %w", err)
		}
		for _, m := range files {
			if m.version <= current {
				continue
			}
			if _, err := tx.Exec(ctx, m.up); err != nil {
				return fmt.Errorf("events: migrate: version %d: %w", m.version, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO outbox_migration (version) VALUES ($1)", m.version); err != nil {
				return fmt.Errorf("events: migrate: version %d: %w", m.version, err)
			}
		}
		// The SQL functions notify the schema's own channel.
		if _, err := tx.Exec(ctx, "UPDATE outbox_settings SET channel = $1 WHERE channel <> $1", sql.ChannelEvents); err != nil {
			return fmt.Errorf("events: migrate: settings: %w", err)
		}
		return nil
	})
}

type migrationFile struct {
	version  int
	up, down string
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
		numStr, _, ok := strings.Cut(name, "_")
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
			m = &migrationFile{version: version}
			byVersion[version] = m
		}
		switch {
		case strings.HasSuffix(name, ".up.sql"):
			m.up = string(body)
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
