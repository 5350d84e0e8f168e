package testdb

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// OweTo writes n events of type typ, fanned out to every subscriber but
// sub, and owes each to sub: the rows a relay's stamp leaves while sub is
// paused, written in two statements so that a large backlog costs the test
// a second rather than a drain of its own.
func OweTo(t testing.TB, pool *pgxpool.Pool, sub, typ string, n int) {
	t.Helper()
	ctx := context.Background()
	// Two statements: the pairs' trigger reads each event's subject, which
	// a data-modifying CTE of the same statement would not show it.
	var from int64
	if err := pool.QueryRow(ctx, "SELECT coalesce(max(seq), 0) FROM outbox_events").Scan(&from); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO outbox_events (id, type, subject, fanned_out_at, fanout)
		SELECT gen_random_uuid(), $1, 'subject:' || (g % 100), now(), '{}' FROM generate_series(1, $2::int) g`, typ, n); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO outbox_deliveries (event_seq, subscriber)
		SELECT seq, $1 FROM outbox_events WHERE seq > $2 AND type = $3`, sub, from, typ); err != nil {
		t.Fatal(err)
	}
}
