package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// isRowFault tells a failure that belongs to the claimed rows (their data, or
// what a subscriber made of it) from a failure of the database or the
// network, which must never count against a row. tx is the failed round's
// transaction, not yet rolled back.
func isRowFault(ctx context.Context, tx pgx.Tx, err error) bool {
	if ctx.Err() != nil || errors.Is(err, errStopping) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// Data exceptions and integrity violations come from what was
		// written. Everything else (connection loss, shutdown and cancel,
		// serialization and deadlock, resources, locks, configuration) is
		// the database's state, not the row's.
		return pgerrcode.IsDataException(pgErr.Code) || pgerrcode.IsIntegrityConstraintViolation(pgErr.Code)
	}
	if isConnError(err) {
		return false
	}
	// Anything else was refused before reaching the database (River's checks
	// of job args and insert options) — if the connection still answers.
	if tx == nil || tx.Conn().IsClosed() {
		return false
	}
	_, probeErr := tx.Exec(ctx, "SELECT 1")
	return probeErr == nil
}

// PanicError is the error of a recovered panic p in host code: an error
// value stays in the chain (isRowFault reads a PostgreSQL error's code).
func PanicError(what string, p any) error {
	if err, ok := p.(error); ok {
		return fmt.Errorf("%s panicked: %w", what, err)
	}
	return fmt.Errorf("%s panicked: %v", what, p)
}

// isConnError reports a failure to talk to the database at all: the network,
// a closed connection, a timeout.
func isConnError(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || pgconn.Timeout(err) || pgconn.SafeToRetry(err)
}

// IsTransient reports a failure that passes when the database is back: a
// lost connection, a server shutting down or starting, too many connections.
func IsTransient(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgerrcode.IsConnectionException(pgErr.Code) || pgerrcode.IsOperatorIntervention(pgErr.Code) ||
			pgerrcode.IsInsufficientResources(pgErr.Code) || pgerrcode.IsTransactionRollback(pgErr.Code)
	}
	return isConnError(err)
}
