package events

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Record stores e inside the caller's transaction, where the relays see it
// once, and only if, the transaction commits. A rollback leaves no trace. It
// returns the stored event, with ID, Seq and CreatedAt set. The relays'
// wake-up notification rides on the same statement, throttled (see
// [Outbox.NotifyInterval]).
//
// When ctx carries an OpenTelemetry span, its W3C trace context is stored
// with the event and copied into the metadata of the event's River jobs, in
// the form otelriver reads (EnableTracePropagation), so a handler's work span
// links to the request that recorded the event.
//
// Invalid input is refused before anything is sent, with an error wrapping
// [ErrInvalidEvent] that names the field, so tx stays usable.
//
// Record uses the tables on the connection's search_path; see [Outbox] for
// another schema.
func Record(ctx context.Context, tx pgx.Tx, e Event) (Event, error) {
	return Outbox{}.Record(ctx, tx, e)
}

// RecordMany is [Record] for many events, in one round trip. Either all are
// refused or none: validation covers the whole slice before anything is sent.
// The returned events are in the order given.
func RecordMany(ctx context.Context, tx pgx.Tx, es []Event) ([]Event, error) {
	return Outbox{}.RecordMany(ctx, tx, es)
}

// Record is [Record] in o's schema.
func (o Outbox) Record(ctx context.Context, tx pgx.Tx, e Event) (Event, error) {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return Event{}, err
	}
	if err := prepare(&e); err != nil {
		return Event{}, err
	}
	query := sql.Record
	if o.notify() {
		query = sql.RecordNotify
	}
	err = tx.QueryRow(ctx, query, e.ID, e.Type, e.Subject, string(e.Payload), traceContextOf(ctx), e.Scope).Scan(&e.Seq, &e.CreatedAt)
	if err != nil {
		return Event{}, fmt.Errorf("events: record: %w", err)
	}
	return e, nil
}

// RecordMany is [RecordMany] in o's schema.
func (o Outbox) RecordMany(ctx context.Context, tx pgx.Tx, es []Event) ([]Event, error) {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return nil, err
	}
	if len(es) == 0 {
		return nil, nil
	}
	out := make([]Event, len(es))
	copy(out, es)
	var (
		ids      = make([]string, len(out))
		types    = make([]string, len(out))
		subjects = make([]string, len(out))
		payloads = make([]string, len(out))
		scopes   = make([]string, len(out))
		index    = make(map[uuid.UUID]int, len(out))
	)
	for i := range out {
		if err := prepare(&out[i]); err != nil {
			return nil, fmt.Errorf("events[%d]: %w", i, err)
		}
		ids[i], types[i], subjects[i], payloads[i], scopes[i] = out[i].ID.String(), out[i].Type, out[i].Subject, string(out[i].Payload), out[i].Scope
		index[out[i].ID] = i
	}
	query := sql.RecordMany
	if o.notify() {
		query = sql.RecordManyNotify
	}
	rows, err := tx.Query(ctx, query, ids, types, subjects, payloads, traceContextOf(ctx), scopes)
	if err != nil {
		return nil, fmt.Errorf("events: record many: %w", err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var e Event
		if err := rows.Scan(&e.ID, &e.Seq, &e.CreatedAt); err != nil {
			return nil, fmt.Errorf("events: record many: %w", err)
		}
		i := index[e.ID]
		out[i].Seq, out[i].CreatedAt = e.Seq, e.CreatedAt
		n++
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("events: record many: %w", err)
	}
	if n != len(out) {
		return nil, fmt.Errorf("events: record many: inserted %d of %d events", n, len(out))
	}
	return out, nil
}

// prepare validates e and fills in what Record assigns.
func prepare(e *Event) error {
	if err := Validate(*e); err != nil {
		return err
	}
	if len(e.Payload) == 0 {
		e.Payload = json.RawMessage("{}")
	}
	id, err := uuid.NewV7()
	if err != nil {
		return fmt.Errorf("events: generating an event ID: %w", err)
	}
	e.ID = id
	return nil
}

// RecordedInTx returns the events that tx's transaction has recorded so far
// — by Record, RecordMany, the SQL function outbox_record or a watch trigger
// (see [Outbox.InstallWatch]) — oldest first. It is how a writer learns the IDs of
// events its triggers made, to wait for them with [Awaiter.AwaitFanout]
// after commit. It reads only pending rows, through the relay's index.
// Under SERIALIZABLE it raises no serialization failure of its own: there,
// every event a transaction records is also noted in a temporary table of
// the session (created on first use, emptied at commit; temporary tables
// take no predicate locks), and RecordedInTx reads that instead. Such a
// transaction cannot be prepared (PREPARE TRANSACTION refuses temporary
// objects). A role without the TEMPORARY privilege on the database notes
// nothing, and there two transactions that both call RecordedInTx may fail
// with a serialization failure (40001), as any two serializable
// transactions that read what the other writes may.
func RecordedInTx(ctx context.Context, tx pgx.Tx) ([]Event, error) {
	return Outbox{}.RecordedInTx(ctx, tx)
}

// RecordedInTx is [RecordedInTx] in o's schema.
func (o Outbox) RecordedInTx(ctx context.Context, tx pgx.Tx) ([]Event, error) {
	sql, err := statementsFor(o.Schema)
	if err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, sql.RecordedInTx)
	if err != nil {
		return nil, fmt.Errorf("events: recorded in tx: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[Event])
	if err != nil {
		return nil, fmt.Errorf("events: recorded in tx: %w", err)
	}
	return out, nil
}
