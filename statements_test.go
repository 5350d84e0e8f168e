package events

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/statements"
	"github.com/standmeet/events/internal/testdb"
)

// Every statement of the query layer prepares on a migrated database — the
// tables, columns, functions and types it names exist as it names them —
// in the search_path's schema and in a named one. In the named schema the
// search_path holds none of the library's or River's tables, so a name the
// layer failed to qualify does not prepare either.
func TestEveryStatementPreparesInTheSearchPathAndInANamedSchema(t *testing.T) {
	t.Parallel()
	for _, schema := range []string{"", "tenant_q"} {
		t.Run("schema="+schema, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t, testdb.EmptyURL(t))
			require.NoError(t, Outbox{Schema: schema}.Migrate(ctx, pool))
			set, err := statements.For(schema)
			require.NoError(t, err)
			conn, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			prepared := 0
			var walk func(v reflect.Value)
			walk = func(v reflect.Value) {
				for i := range v.NumField() {
					f := v.Type().Field(i)
					switch {
					case f.Tag.Get("sql") == "-":
					case f.Type.Kind() == reflect.Struct:
						walk(v.Field(i))
					case strings.Contains(v.Field(i).String(), "TEMPLATE"):
						// Call-time DDL (watch triggers, CREATE SCHEMA): the
						// watch and migrate tests run it.
					default:
						_, err := conn.Conn().Prepare(ctx, "layer_"+f.Name, v.Field(i).String())
						require.NoError(t, err, "%s does not prepare in schema %q", f.Name, schema)
						prepared++
					}
				}
			}
			walk(reflect.ValueOf(set).Elem())
			require.Greater(t, prepared, 90)
		})
	}
}
