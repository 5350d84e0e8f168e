// Package dbutil holds the small pgx helpers that the relay and its
// background duties share.
package dbutil

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SendBegun sends b, which begins a transaction on c (b.BeginTx) and queues
// its first statements, and returns the transaction; if the batch fails, a
// transaction it left open is rolled back.
func SendBegun(ctx context.Context, c *pgxpool.Conn, b *pgx.Batch) (pgx.Tx, error) {
	br := c.SendBatch(ctx, b)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		if c.Conn().PgConn().TxStatus() != 'I' {
			_ = tx.Rollback(ctx)
		}
		return nil, err
	}
	return tx, nil
}

// NilIfEmpty is nil for "" (a NULL parameter), else a pointer to s.
func NilIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
