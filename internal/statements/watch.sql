-- Watches: triggers on host tables that record events (InstallWatch). The
-- catalog is read without locking the table; the DDL names what it creates,
-- so its identifiers are call-time templates, quoted by the caller. A
-- trigger's definition is fingerprinted (its comment): keep CreateWatchTrigger
-- byte for byte, or every installed watch is replaced once.

-- name: ResolveTable
-- $1 a table's name, quoted: its schema and name, if it is a table.
SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.oid = to_regclass($1) AND c.relkind IN ('r', 'p');

-- name: TableColumns
-- $1 the table: its columns, and whether each is in the primary key.
SELECT a.attname, coalesce(a.attnum = ANY(i.indkey), false)
  FROM pg_attribute a
  LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
 WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum;

-- name: WatchTriggers
-- $1 the table, $2 trigger names: those it has, with their comments.
SELECT tgname::text, coalesce(obj_description(oid, 'pg_trigger'), '')
  FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname = ANY($2::text[]);

-- name: ListWatches
-- $1 the trigger function's signature: every trigger calling it.
SELECT n.nspname::text, c.relname::text, t.tgname::text, t.tgargs, t.tgtype::int
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE t.tgfoid = to_regprocedure($1)
 ORDER BY 1, 2, 3;

-- name: CreateWatchTrigger
-- event is INSERT, DELETE, UPDATE or UPDATE OF columns; when is empty or
-- " WHEN (…)"; function_args the trigger's arguments as literals.
CREATE TRIGGER /* TEMPLATE: trigger */ AFTER /* TEMPLATE: event */ ON /* TEMPLATE: table */ FOR EACH ROW/* TEMPLATE: when */ EXECUTE FUNCTION /* TEMPLATE: schema */outbox_watch(/* TEMPLATE: function_args */);

-- name: CommentWatchTrigger
COMMENT ON TRIGGER /* TEMPLATE: trigger */ ON /* TEMPLATE: table */ IS /* TEMPLATE: comment */;

-- name: DropWatchTrigger
DROP TRIGGER IF EXISTS /* TEMPLATE: trigger */ ON /* TEMPLATE: table */;
