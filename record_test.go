package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/statements"
	"github.com/standmeet/events/internal/testdb"
)

func TestRecordReturnsTheStoredEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	e, err := Record(ctx, tx, Event{Type: "note.changed", Subject: "note:1", Payload: json.RawMessage(`{"a":1}`)})
	require.NoError(t, err)
	require.NotEqual(t, uuid.Nil, e.ID)
	require.Positive(t, e.Seq)
	require.WithinDuration(t, time.Now(), e.CreatedAt, time.Minute)
	empty, err := Record(ctx, tx, Event{Type: "note.touched"})
	require.NoError(t, err)
	require.JSONEq(t, `{}`, string(empty.Payload))
	require.NoError(t, tx.Commit(ctx))

	rows := loadRows(t, pool)
	require.Equal(t, e.Seq, rows[e.ID].Seq)
	require.Equal(t, "note:1", rows[e.ID].Subject)
	require.JSONEq(t, `{"a":1}`, string(rows[e.ID].Payload))
	require.False(t, rows[e.ID].FannedOut)
}

func TestRecordIsInvisibleUntilCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = Record(ctx, tx, Event{Type: "note.changed"})
	require.NoError(t, err)
	require.Empty(t, loadRows(t, pool), "visible before commit")
	require.NoError(t, tx.Rollback(ctx))
	require.Empty(t, loadRows(t, pool), "a rollback leaves no trace")
}

// Each refusal must name the field, happen before anything is sent, and leave
// the caller's transaction usable.
func TestRefusedEventsLeaveTheTransactionUsable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	tests := []struct {
		name  string
		event Event
		field string
	}{
		{"empty type", Event{}, "Type"},
		{"type with a space", Event{Type: "note changed"}, "Type"},
		{"type with an empty segment", Event{Type: "note..changed"}, "Type"},
		{"type with a wildcard", Event{Type: "note.*"}, "Type"},
		{"type too long", Event{Type: strings.Repeat("a", MaxTypeLength+1)}, "Type"},
		{"subject too long", Event{Type: "a", Subject: strings.Repeat("s", MaxSubjectLength+1)}, "Subject"},
		{"subject with NUL", Event{Type: "a", Subject: "x\x00y"}, "Subject"},
		{"subject not UTF-8", Event{Type: "a", Subject: "\xff"}, "Subject"},
		{"payload not JSON", Event{Type: "a", Payload: []byte(`{"a":`)}, "Payload"},
		{"payload with \\u0000", Event{Type: "a", Payload: []byte(`{"a":"x\u0000"}`)}, "Payload"},
		{"payload with a lone surrogate", Event{Type: "a", Payload: []byte(`["\ud800"]`)}, "Payload"},
		{"payload number too large for numeric", Event{Type: "a", Payload: []byte(`{"n":1e131072}`)}, "Payload"},
		{"payload number too precise for numeric", Event{Type: "a", Payload: []byte(`[0.1e-16383]`)}, "Payload"},
		{"payload too large", Event{Type: "a", Payload: []byte(`"` + strings.Repeat("x", MaxPayloadBytes) + `"`)}, "Payload"},
		{"ID set by the caller", Event{Type: "a", ID: uuid.New()}, "ID"},
	}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	for _, tt := range tests {
		_, err := Record(ctx, tx, tt.event)
		require.ErrorIs(t, err, ErrInvalidEvent, tt.name)
		require.Contains(t, err.Error(), tt.field, tt.name)
		_, err = RecordMany(ctx, tx, []Event{{Type: "ok"}, tt.event})
		require.ErrorIs(t, err, ErrInvalidEvent, tt.name)
		require.Contains(t, err.Error(), "events[1]", tt.name)
	}
	// The transaction is still good: it records and commits.
	_, err = Record(ctx, tx, Event{Type: "note.ok", Payload: []byte(`{"escaped":"\\u0000 is text here","pair":"\ud83d\ude00","big":9e131071,"small":-1e-16383,"zero":0e1000,"x":"1e999999"}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Len(t, loadRows(t, pool), 1)
}

func TestRecordManyIsOneStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	tracer := &statementCounter{}
	cfg.Tracer = tracer
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)

	es := make([]Event, 2000)
	for i := range es {
		es[i] = Event{Type: "doc.imported", Subject: "doc", Payload: json.RawMessage(`{"i":` + strings.Repeat("1", 1+i%5) + `}`)}
	}
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	tracer.n = 0
	got, err := RecordMany(ctx, tx, es)
	require.NoError(t, err)
	require.Equal(t, 1, tracer.n, "statements sent by RecordMany")
	require.NoError(t, tx.Commit(ctx))

	require.Len(t, got, 2000)
	rows := loadRows(t, testdb.Pool(t, url))
	require.Len(t, rows, 2000)
	for i, e := range got {
		require.Equal(t, rows[e.ID].Seq, e.Seq)
		require.JSONEq(t, string(es[i].Payload), string(rows[e.ID].Payload), "events come back in the order given")
	}
}

type statementCounter struct{ n int }

func (s *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	s.n++
	return ctx
}
func (s *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestRecordInASchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	require.NoError(t, Outbox{Schema: "outbox"}.Migrate(ctx, pool))
	rec := Outbox{Schema: "outbox"}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := rec.Record(ctx, tx, Event{Type: "a"})
		return err
	}))
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox.outbox_events").Scan(&n))
	require.Equal(t, 1, n)
	require.Empty(t, loadRows(t, pool), "the search_path's table is untouched")

	_, err := Outbox{Schema: `x"; DROP TABLE river_job; --`}.Record(ctx, nil, Event{Type: "a"})
	require.ErrorIs(t, err, ErrInvalidConfig)
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "Outbox.Schema", ve.Field)
}

// Channels are qualified by schema: a relay of one schema is not woken by
// writes to another, and SQL-made events notify their own schema's channel.
func TestChannelsAreQualifiedBySchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	pool := testdb.Pool(t, url)
	require.NoError(t, Outbox{Schema: "tenant_a"}.Migrate(ctx, pool))
	require.NoError(t, Outbox{Schema: "tenant_b"}.Migrate(ctx, pool))

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, ch := range []string{statements.ChannelEvents, "tenant_a." + statements.ChannelEvents, "tenant_b." + statements.ChannelEvents} {
		_, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize())
		require.NoError(t, err)
	}
	next := func() string {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		n, err := conn.WaitForNotification(wctx)
		require.NoError(t, err)
		return n.Channel
	}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := Outbox{Schema: "tenant_a"}.Record(ctx, tx, Event{Type: "a"})
		return err
	}))
	require.Equal(t, "tenant_a."+statements.ChannelEvents, next())
	_, err = pool.Exec(ctx, "SELECT tenant_b.outbox_record('b')")
	require.NoError(t, err)
	require.Equal(t, "tenant_b."+statements.ChannelEvents, next())
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// Not throttled: the default schema's limiter is shared with every
		// other test of this process, which may have just notified.
		_, err := Outbox{NotifyInterval: NotifyEveryTransaction}.Record(ctx, tx, Event{Type: "c"})
		return err
	}))
	require.Equal(t, statements.ChannelEvents, next())
}

func TestValidateTypeErrorsAreSentinels(t *testing.T) {
	t.Parallel()
	err := ValidateType("")
	require.True(t, errors.Is(err, ErrInvalidEvent))
	require.NoError(t, ValidateType("corpus.note.changed"))
	require.NoError(t, ValidateType("a-b_c.D9"))
}

// The host's transaction is never put at risk: at every isolation level, 16
// writers each updating rows of their own and recording events by every
// write path fail exactly as often as the same transactions without the
// library — never. (The SQL paths used to claim a shared settings row inside
// the host's transaction; under REPEATABLE READ most writers then failed
// with 40001.) And every committed event is fanned out.
func TestEveryWritePathAtEveryIsolationLevel(t *testing.T) {
	t.Parallel()
	const (
		writers = 16
		txs     = 25
	)
	paths := []struct {
		name  string
		write func(ctx context.Context, tx pgx.Tx, row int) error
	}{
		{"no library", func(ctx context.Context, tx pgx.Tx, row int) error {
			_, err := tx.Exec(ctx, "UPDATE plain_notes SET title = title || '!' WHERE id = $1", row)
			return err
		}},
		{"Record", func(ctx context.Context, tx pgx.Tx, row int) error {
			if _, err := tx.Exec(ctx, "UPDATE plain_notes SET title = title || '!' WHERE id = $1", row); err != nil {
				return err
			}
			_, err := Record(ctx, tx, Event{Type: "note.changed", Subject: fmt.Sprint("note:", row)})
			return err
		}},
		{"RecordMany", func(ctx context.Context, tx pgx.Tx, row int) error {
			if _, err := tx.Exec(ctx, "UPDATE plain_notes SET title = title || '!' WHERE id = $1", row); err != nil {
				return err
			}
			_, err := RecordMany(ctx, tx, []Event{{Type: "note.changed"}, {Type: "note.touched"}})
			return err
		}},
		{"outbox_record", func(ctx context.Context, tx pgx.Tx, row int) error {
			_, err := tx.Exec(ctx, "UPDATE plain_notes SET title = title || '!' WHERE id = $1", row)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, "SELECT outbox_record('note.changed', $1)", fmt.Sprint("note:", row))
			return err
		}},
		{"watch trigger", func(ctx context.Context, tx pgx.Tx, row int) error {
			_, err := tx.Exec(ctx, "UPDATE corpus_notes SET title = title || '!' WHERE id = $1", row)
			return err
		}},
		// A writer that learns the IDs its triggers made, for receipts.
		{"watch trigger and RecordedInTx", func(ctx context.Context, tx pgx.Tx, row int) error {
			if _, err := tx.Exec(ctx, "UPDATE corpus_notes SET title = title || '!' WHERE id = $1", row); err != nil {
				return err
			}
			made, err := RecordedInTx(ctx, tx)
			if err == nil && len(made) != 1 {
				err = fmt.Errorf("RecordedInTx returned %d events, want 1", len(made))
			}
			return err
		}},
	}
	levels := []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}
	for _, level := range levels {
		for _, path := range paths {
			t.Run(fmt.Sprintf("%s/%s", level, path.name), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				b := setup(t, setupOpts{}, mapSub("audit", false, "**"))
				// A host workload that does not fail on its own: enough rows,
				// analysed, for the planner to update by the primary key (a
				// sequential scan takes a predicate lock on the whole table),
				// and room in the pages for HOT updates (an index entry added
				// to a leaf page another SERIALIZABLE writer read is a
				// conflict), so that these writers never fail among
				// themselves, library or not.
				createNotes(t, b.pool, 20_000)
				exec(t, b.pool, "CREATE TABLE plain_notes (id int PRIMARY KEY, title text NOT NULL) WITH (fillfactor = 50)")
				exec(t, b.pool, "INSERT INTO plain_notes SELECT g, 'note' FROM generate_series(1, 20000) g")
				exec(t, b.pool, "ALTER TABLE corpus_notes SET (fillfactor = 50)")
				exec(t, b.pool, "VACUUM FULL corpus_notes")
				exec(t, b.pool, "ANALYZE corpus_notes, plain_notes")
				require.NoError(t, outbox.InstallWatch(ctx, b.pool, Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed"}}))
				// Every SQL-side transaction would notify if the throttle
				// let it: the throttle must decide without a shared row.
				exec(t, b.pool, "UPDATE outbox_settings SET notify_interval = '1 millisecond'")

				var failed, committed atomic.Int64
				var firstErr sync.Once
				var errSeen error
				start := make(chan struct{})
				var wg sync.WaitGroup
				for w := range writers {
					wg.Go(func() {
						<-start
						for i := range txs {
							row := 1 + w*txs + i
							err := pgx.BeginTxFunc(ctx, b.pool, pgx.TxOptions{IsoLevel: level}, func(tx pgx.Tx) error {
								// Take the snapshot first, then give others
								// time to commit past it: the window in which
								// a shared row updated by a committed writer
								// raised 40001.
								if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
									return err
								}
								time.Sleep(time.Millisecond) // workload think time, not a wait for a condition
								return path.write(ctx, tx, row)
							})
							if err != nil {
								failed.Add(1)
								firstErr.Do(func() { errSeen = err })
								continue
							}
							committed.Add(1)
						}
					})
				}
				close(start)
				wg.Wait()
				var pgErr *pgconn.PgError
				if errors.As(errSeen, &pgErr) {
					t.Logf("first failure: %s %s", pgErr.Code, pgErr.Message)
				}
				require.Zero(t, failed.Load(), "%s at %s: %d of %d transactions failed (first: %v); without the library none do",
					path.name, level, failed.Load(), writers*txs, errSeen)
				if errSeen != nil && pgErr != nil {
					require.NotEqual(t, pgerrcode.SerializationFailure, pgErr.Code)
				}
				if path.name == "no library" {
					return
				}
				b.start(t)
				waitFannedOut(t, b.pool, 30*time.Second)
				var n int64
				require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE fanned_out_at IS NOT NULL").Scan(&n))
				perTx := int64(1)
				if path.name == "RecordMany" {
					perTx = 2
				}
				require.Equal(t, committed.Load()*perTx, n, "every committed event is fanned out")
			})
		}
	}
}

// RecordedInTx returns, at every isolation level, every event its
// transaction recorded (Record, RecordMany, outbox_record, a watch trigger),
// in order, a rolled-back savepoint's excepted; and the next transaction of
// the same session only its own. Under SERIALIZABLE it reads them from the
// session's temporary table (migration 014); in a named schema too.
func TestRecordedInTxAtEveryIsolationLevel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	pool := testdb.Pool(t, url)
	named := Outbox{Schema: "Ledger_Outbox"}
	require.NoError(t, named.Migrate(ctx, pool))
	createNotes(t, pool, 3)
	require.NoError(t, outbox.InstallWatch(ctx, pool, Watch{Table: "corpus_notes", Types: map[Op]string{OpUpdate: "note.changed"}}))
	for _, level := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(level), func(t *testing.T) {
			conn, err := pool.Acquire(ctx) // one session for both transactions
			require.NoError(t, err)
			defer conn.Release()
			var want []uuid.UUID
			var got, gotNamed, second []Event
			require.NoError(t, pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: level}, func(tx pgx.Tx) error {
				one, err := Record(ctx, tx, Event{Type: "note.changed", Subject: "note:1"})
				if err != nil {
					return err
				}
				many, err := RecordMany(ctx, tx, []Event{{Type: "a"}, {Type: "b"}})
				if err != nil {
					return err
				}
				var sqlID uuid.UUID
				if err := tx.QueryRow(ctx, "SELECT outbox_record('c')").Scan(&sqlID); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, "UPDATE corpus_notes SET title = title || '!' WHERE id = 2"); err != nil {
					return err
				}
				// Recorded in a savepoint rolled back: not the transaction's.
				sp, err := tx.Begin(ctx)
				if err != nil {
					return err
				}
				if _, err := Record(ctx, sp, Event{Type: "gone"}); err != nil {
					return err
				}
				if err := sp.Rollback(ctx); err != nil {
					return err
				}
				other, err := named.Record(ctx, tx, Event{Type: "elsewhere"})
				if err != nil {
					return err
				}
				want = []uuid.UUID{one.ID, many[0].ID, many[1].ID, sqlID}
				if got, err = RecordedInTx(ctx, tx); err != nil {
					return err
				}
				if gotNamed, err = named.RecordedInTx(ctx, tx); err != nil {
					return err
				}
				if len(gotNamed) != 1 || gotNamed[0].ID != other.ID {
					return fmt.Errorf("the named schema's RecordedInTx returned %v, want only %s", gotNamed, other.ID)
				}
				return nil
			}))
			require.Len(t, got, 5, "%v", got)
			for i, id := range want {
				require.Equal(t, id, got[i].ID, "event %d", i)
			}
			require.Equal(t, "note.changed", got[4].Type, "the watch trigger's event")
			require.Equal(t, "note:1", got[0].Subject)
			require.JSONEq(t, "{}", string(got[1].Payload))
			require.NoError(t, pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: level}, func(tx pgx.Tx) error {
				e, err := Record(ctx, tx, Event{Type: "next"})
				if err != nil {
					return err
				}
				if second, err = RecordedInTx(ctx, tx); err != nil {
					return err
				}
				if len(second) != 1 || second[0].ID != e.ID {
					return fmt.Errorf("the next transaction's RecordedInTx returned %d events, want only its own", len(second))
				}
				return nil
			}))
			var noted bool
			require.NoError(t, conn.QueryRow(ctx, "SELECT to_regclass('pg_temp.outbox_recorded') IS NOT NULL").Scan(&noted))
			require.Equal(t, level == pgx.Serializable, noted, "the session noted events only under SERIALIZABLE")
		})
	}
}

// RecordedInTx, below SERIALIZABLE, reads the partition its transaction's
// rows went to, not the whole outbox table: a read of the table would wait
// behind retention's exclusive lock on an old partition, inside the host's
// transaction.
func TestRecordedInTxDoesNotWaitForRetentionsLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	retention, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = retention.Rollback(ctx) }()
	var old string
	require.NoError(t, retention.QueryRow(ctx, "SELECT 'outbox_events_' || (outbox_slot_of(now()) + 5) % 10").Scan(&old))
	_, err = retention.Exec(ctx, "LOCK TABLE "+old+" IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	within, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, pgx.BeginFunc(within, b.pool, func(tx pgx.Tx) error {
		e, err := Record(within, tx, Event{Type: "host.write"})
		if err != nil {
			return err
		}
		got, err := RecordedInTx(within, tx)
		if err != nil {
			return err
		}
		if len(got) != 1 || got[0].ID != e.ID {
			return fmt.Errorf("RecordedInTx returned %v, want %s", got, e.ID)
		}
		return nil
	}), "the host transaction waited for retention's lock")
}
