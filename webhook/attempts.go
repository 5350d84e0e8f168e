package webhook

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
)

// Attempt is one delivery attempt, as the attempt log keeps it.
type Attempt struct {
	ID         int64
	EndpointID uuid.UUID
	EventID    uuid.UUID
	// Attempt is the job's attempt number, 1 for the first.
	Attempt int
	// Status is the HTTP status; 0 when no answer came.
	Status int
	// ErrorClass is "" for a success, else "status", "timeout", "network",
	// "redirect", "forbidden_address", ….
	ErrorClass string
	Error      string
	Duration   time.Duration
	// DialedIP is the address the request went to.
	DialedIP string
	// Response is the start of the response body (Config.MaxResponseBytes),
	// as text: a NUL byte and every byte of invalid UTF-8 appear as \xNN.
	Response  string
	CreatedAt time.Time
}

// AttemptFilter selects attempts. Zero fields select everything.
type AttemptFilter struct {
	EndpointID   uuid.UUID
	EventID      uuid.UUID
	FailuresOnly bool
	// Before pages: attempts with a smaller ID (the last ID of the previous
	// page).
	Before int64
	// Limit defaults to 50; at most 1000.
	Limit int
}

// Attempts lists attempts, newest first.
func (w *Webhooks) Attempts(ctx context.Context, f AttemptFilter) ([]Attempt, error) {
	if f.Limit <= 0 || f.Limit > 1000 {
		f.Limit = 50
	}
	var endpoint, event *uuid.UUID
	if f.EndpointID != uuid.Nil {
		endpoint = &f.EndpointID
	}
	if f.EventID != uuid.Nil {
		event = &f.EventID
	}
	var before *int64
	if f.Before > 0 {
		before = &f.Before
	}
	rows, err := w.pool.Query(ctx, w.sql.ListAttempts, endpoint, event, f.FailuresOnly, before, f.Limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Attempt, error) {
		var a Attempt
		var ms int64
		err := row.Scan(&a.ID, &a.EndpointID, &a.EventID, &a.Attempt, &a.Status, &a.ErrorClass, &a.Error, &ms,
			&a.DialedIP, &a.Response, &a.CreatedAt)
		a.Duration = time.Duration(ms) * time.Millisecond
		return a, err
	})
}

// pruneBatch is how many attempts one statement of PruneAttempts deletes.
const pruneBatch = 5000

// PruneAttempts deletes attempts older than before, in batches of 5,000,
// and returns how many it deleted.
func (w *Webhooks) PruneAttempts(ctx context.Context, before time.Time) (int64, error) {
	var total int64
	for {
		tag, err := w.pool.Exec(ctx, w.sql.PruneAttempts, before, pruneBatch)
		if err != nil {
			return total, err
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < pruneBatch {
			return total, nil
		}
	}
}

// PruneArgs are the args of the periodic attempt-log pruning job.
type PruneArgs struct{}

// Kind is "webhook.prune_attempts".
func (PruneArgs) Kind() string { return "webhook.prune_attempts" }

type pruneWorker struct {
	river.WorkerDefaults[PruneArgs]
	w *Webhooks
}

func (p *pruneWorker) Work(ctx context.Context, _ *river.Job[PruneArgs]) error {
	_, err := p.w.PruneAttempts(ctx, time.Now().Add(-p.w.config.AttemptRetention))
	return err
}

// cleanText makes bytes from outside (a receiver's answer, an error) storable
// as PostgreSQL text and safe to print: NUL, which text cannot hold, and every
// byte of invalid UTF-8 become \xNN; everything else is kept.
func cleanText(b []byte) string {
	var sb strings.Builder
	sb.Grow(len(b))
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		switch {
		case r == utf8.RuneError && size == 1, r == 0:
			fmt.Fprintf(&sb, `\x%02x`, b[0])
		default:
			sb.Write(b[:size])
		}
		b = b[size:]
	}
	return sb.String()
}

// cutRune drops an incomplete UTF-8 sequence at the end of b, left by cutting
// a body at the size limit, so that the cut is not mistaken for bad bytes.
func cutRune(b []byte) []byte {
	for i := 1; i < utf8.UTFMax && i <= len(b); i++ {
		if utf8.RuneStart(b[len(b)-i]) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i]
			}
			break
		}
	}
	return b
}
