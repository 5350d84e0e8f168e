// Package migrations holds the library's schema as plain, versioned SQL files,
// embedded so that [github.com/standmeet/events.Outbox.Migrate] can apply them.
//
// Teams with their own migration tool can take the files as they are: each
// version N has NNN_name.up.sql and NNN_name.down.sql. The files use
// unqualified names; run them with search_path set to the schema that should
// hold the tables. River's own tables must exist too (see rivermigrate).
package migrations

import "embed"

// FS holds the migration files.
//
//go:embed *.sql
var FS embed.FS
