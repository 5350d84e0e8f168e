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
-- $1 the table, $2 trigger names: those it has, with their comments, the
-- functions they call, and whether this role may drop that function.
SELECT t.tgname::text, coalesce(obj_description(t.oid, 'pg_trigger'), ''), p.proname::text,
       pg_has_role(p.proowner, 'USAGE')
  FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
 WHERE t.tgrelid = $1::regclass AND t.tgname = ANY($2::text[]);

-- name: LockWatch
-- $1 the qualified table and the watch's name: a transaction-level advisory
-- lock, so that InstallWatch and RemoveWatch calls for one watch take turns.
SELECT pg_advisory_xact_lock(hashtextextended('standmeet_events.watch ' || $1::text, 0));

-- name: WatchSchema
-- $1 the generic trigger function's signature: the schema that holds it
-- (where a watch's own trigger functions go), and whether this role may
-- create functions there.
SELECT n.nspname::text, has_schema_privilege(n.oid, 'CREATE')
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE p.oid = to_regprocedure($1);

-- name: ListWatches
-- $1 the generic trigger function's signature: every trigger calling it or
-- a watch's own function beside it (outbox_watch_ and 16 hex digits).
SELECT n.nspname::text, c.relname::text, t.tgname::text, t.tgargs, t.tgtype::int
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_proc p ON p.oid = t.tgfoid
 WHERE t.tgfoid = to_regprocedure($1)
    OR (p.proname ~ '^outbox_watch_[0-9a-f]{16}$'
        AND p.pronamespace = (SELECT pronamespace FROM pg_proc WHERE oid = to_regprocedure($1)))
 ORDER BY 1, 2, 3;

-- name: CreateWatchTrigger
-- event is INSERT, DELETE, UPDATE or UPDATE OF columns; when is empty or
-- " WHEN (…)"; function the trigger function, qualified (the generic
-- outbox_watch, rendered so for the fingerprint, or the watch's own);
-- function_args the trigger's arguments as literals.
CREATE TRIGGER /* TEMPLATE: trigger */ AFTER /* TEMPLATE: event */ ON /* TEMPLATE: table */ FOR EACH ROW/* TEMPLATE: when */ EXECUTE FUNCTION /* TEMPLATE: function */(/* TEMPLATE: function_args */);

-- name: CommentWatchTrigger
COMMENT ON TRIGGER /* TEMPLATE: trigger */ ON /* TEMPLATE: table */ IS /* TEMPLATE: comment */;

-- name: DropWatchTrigger
DROP TRIGGER IF EXISTS /* TEMPLATE: trigger */ ON /* TEMPLATE: table */;

-- name: CreateWatchFunction
-- A watch's own trigger function (see watchfn.go): function its qualified
-- name, schema the outbox's (quoted), tag a dollar-quote tag the body does
-- not hold, and the INSERT's values, as SQL expressions.
CREATE OR REPLACE FUNCTION /* TEMPLATE: function */()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, /* TEMPLATE: schema_name */
AS /* TEMPLATE: tag */
BEGIN
    INSERT INTO /* TEMPLATE: schema */outbox_events (id, type, subject, payload, scope)
    VALUES (/* TEMPLATE: schema */outbox_uuidv7(), /* TEMPLATE: type */, /* TEMPLATE: subject */, /* TEMPLATE: payload */, /* TEMPLATE: scope */);
    RETURN NULL;
END
/* TEMPLATE: tag */;

-- name: DropWatchFunction
DROP FUNCTION IF EXISTS /* TEMPLATE: function */();
