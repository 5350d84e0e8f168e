-- Migrate's own bookkeeping. Each version runs in a transaction of its own
-- that takes the migration lock first (transaction-level: it works through
-- PgBouncer), and, for a named schema, creates it and sets the search_path
-- to it (SetLocal) for the version's unqualified SQL.

-- name: MigrateLock
-- $1 the lock's key.
SELECT pg_advisory_xact_lock($1);

-- name: CreateSchema
CREATE SCHEMA IF NOT EXISTS /* TEMPLATE: schema_name */;

-- name: CreateMigrationTable
CREATE TABLE IF NOT EXISTS /* TEMPLATE: schema */outbox_migration (
    version    integer     PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now());

-- name: MigrationVersions
-- The versions applied: each one the database lacks is applied, whatever
-- higher ones it has (versions may land out of number order).
SELECT coalesce(array_agg(version ORDER BY version), '{}') FROM /* TEMPLATE: schema */outbox_migration;

-- name: MigrationApplied
-- $1 the version applied.
INSERT INTO /* TEMPLATE: schema */outbox_migration (version) VALUES ($1);

-- name: RelationExists
-- $1 a table's name, qualified as the schema's are.
SELECT to_regclass($1) IS NOT NULL;

-- name: SetChannel
-- $1 the schema's channel, for the SQL functions' notifications.
UPDATE /* TEMPLATE: schema */outbox_settings SET channel = $1 WHERE channel <> $1;
