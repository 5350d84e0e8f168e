package events

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

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
	for _, ch := range []string{ChannelEvents, "tenant_a." + ChannelEvents, "tenant_b." + ChannelEvents} {
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
	require.Equal(t, "tenant_a."+ChannelEvents, next())
	_, err = pool.Exec(ctx, "SELECT tenant_b.outbox_record('b')")
	require.NoError(t, err)
	require.Equal(t, "tenant_b."+ChannelEvents, next())
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// Not throttled: the default schema's limiter is shared with every
		// other test of this process, which may have just notified.
		_, err := Outbox{NotifyInterval: NotifyEveryTransaction}.Record(ctx, tx, Event{Type: "c"})
		return err
	}))
	require.Equal(t, ChannelEvents, next())
}

func TestValidateTypeErrorsAreSentinels(t *testing.T) {
	t.Parallel()
	err := ValidateType("")
	require.True(t, errors.Is(err, ErrInvalidEvent))
	require.NoError(t, ValidateType("corpus.note.changed"))
	require.NoError(t, ValidateType("a-b_c.D9"))
}
