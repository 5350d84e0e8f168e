package events

import (
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
)

// A named schema whose name needs quoting (upper case) works like a
// lower-case one: every statement, the channels, the watch triggers.
func TestReview20MixedCaseSchemaEndToEnd(t *testing.T) {
	t.Parallel()
	exerciseAll(t, testdb.Pool(t, testdb.EmptyURL(t)), "Billing_EU", ListenerConfig{PollInterval: time.Hour})
}

// The Outbox accepts exactly the schema names a River client accepts: one
// Migrate creates but no River client can use (River keeps 63 bytes for
// "<schema>.<its longest channel>") is refused up front, not after the
// schema is created.
func TestOutboxSchemaLengthIsRiversLimit(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t, testdb.URL(t))
	for _, n := range []int{46, 47, 63} {
		schema := "s" + strings.Repeat("x", n-1)
		_, riverErr := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: schema, Logger: quietLogger()})
		err := Outbox{Schema: schema}.Validate()
		if riverErr != nil {
			require.ErrorIs(t, err, ErrInvalidConfig, "%d bytes: River refuses it (%v), the Outbox must too", n, riverErr)
		} else {
			require.NoError(t, err, "%d bytes", n)
		}
	}
	// A schema at River's limit works end to end, its channels hashed.
	exerciseAll(t, testdb.Pool(t, testdb.EmptyURL(t)), "S"+strings.Repeat("x", 45), ListenerConfig{PollInterval: time.Hour})
}
