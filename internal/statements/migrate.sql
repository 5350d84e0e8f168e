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

-- name: IndexState
-- $1 an index's (qualified) name: whether it is valid, and whether a build
-- of it may be in progress: CREATE INDEX CONCURRENTLY reports its index
-- before it commits the index's catalog row, but the progress view hides
-- another user's backend from a role without pg_read_all_stats; pg_locks
-- hides nothing, and the build holds SHARE UPDATE EXCLUSIVE on the table
-- throughout. So do VACUUM and ANALYZE, autovacuum's included: their
-- backends are left out (the progress views show every backend's pid to
-- every role). Taken for a build, an autovacuum of a large outbox was
-- waited out; a DROP INDEX CONCURRENTLY queued behind it cancels it, as
-- PostgreSQL cancels an autovacuum that blocks a lock (a manual VACUUM is
-- waited for either way). No row: there is no such index.
SELECT i.indisvalid,
       EXISTS (SELECT 1 FROM pg_stat_progress_create_index p WHERE p.index_relid = i.indexrelid)
       OR EXISTS (SELECT 1 FROM pg_locks l
                   WHERE l.locktype = 'relation' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                     AND l.relation = i.indrelid AND l.mode = 'ShareUpdateExclusiveLock' AND l.granted
                     AND l.pid <> pg_backend_pid()
                     AND l.pid NOT IN (SELECT pid FROM pg_stat_progress_vacuum UNION ALL SELECT pid FROM pg_stat_progress_analyze))
  FROM pg_index i
 WHERE i.indexrelid = to_regclass($1);
