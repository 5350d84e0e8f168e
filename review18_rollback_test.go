package events

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// A transaction (or savepoint) that took the notify slot and then rolled back
// sent nothing, but the slot stays taken (sequences do not roll back): a
// transaction that commits in the same interval stays quiet, and its event
// waits for a relay's poll. Under 003 the claim (an UPDATE of notified_at)
// rolled back with the transaction, so the committed one notified.
func TestARolledBackNotifyDoesNotQuietTheCommittedOnes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, how := range []string{"transaction", "savepoint"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{})
			// One notification an hour: none has been sent this hour.
			exec(t, b.pool, "UPDATE outbox_settings SET notify_interval = '1 hour'")
			conn := listenEvents(t, b.url)
			require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				if how == "transaction" {
					inner, err := b.pool.Begin(ctx)
					if err != nil {
						return err
					}
					if _, err := inner.Exec(ctx, "SELECT outbox_record('rolled.back')"); err != nil {
						return err
					}
					if err := inner.Rollback(ctx); err != nil {
						return err
					}
				} else {
					if _, err := tx.Exec(ctx, "SAVEPOINT s"); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, "SELECT outbox_record('rolled.back')"); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT s"); err != nil {
						return err
					}
				}
				_, err := tx.Exec(ctx, "SELECT outbox_record('committed')")
				return err
			}))
			require.True(t, notified(conn, 3*time.Second),
				"the only committed SQL-side event of the interval sent no notification (a rolled-back %s took the slot)", how)
		})
	}
}
