package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/standmeet/events/internal/glob"
)

// Record stores e inside the caller's transaction and notifies the relays,
// who see it once, and only if, the transaction commits. A rollback leaves no
// trace. It returns the stored event, with ID, Seq and CreatedAt set.
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
	if err := validateSchema(o.Schema); err != nil {
		return Event{}, err
	}
	if err := prepare(&e); err != nil {
		return Event{}, err
	}
	// The NOTIFY rides on the same statement: one round trip. Its payload is
	// constant so PostgreSQL folds a transaction's notifies into one.
	err := tx.QueryRow(ctx, `WITH ins AS (
		INSERT INTO `+qualify(o.Schema, tableName)+` (id, type, subject, payload)
		VALUES ($1, $2, $3, $4::text::jsonb)
		RETURNING seq, created_at)
		SELECT seq, created_at, pg_notify('`+ChannelEvents+`', '') FROM ins`,
		e.ID, e.Type, e.Subject, string(e.Payload)).Scan(&e.Seq, &e.CreatedAt, nil)
	if err != nil {
		return Event{}, fmt.Errorf("events: record: %w", err)
	}
	return e, nil
}

// RecordMany is [RecordMany] in o's schema.
func (o Outbox) RecordMany(ctx context.Context, tx pgx.Tx, es []Event) ([]Event, error) {
	if err := validateSchema(o.Schema); err != nil {
		return nil, err
	}
	if len(es) == 0 {
		return nil, nil
	}
	out := make([]Event, len(es))
	copy(out, es)
	var (
		ids      = make([]uuid.UUID, len(out))
		types    = make([]string, len(out))
		subjects = make([]string, len(out))
		payloads = make([]string, len(out))
		index    = make(map[uuid.UUID]int, len(out))
	)
	for i := range out {
		if err := prepare(&out[i]); err != nil {
			return nil, fmt.Errorf("events[%d]: %w", i, err)
		}
		ids[i], types[i], subjects[i], payloads[i] = out[i].ID, out[i].Type, out[i].Subject, string(out[i].Payload)
		index[out[i].ID] = i
	}
	// RETURNING order is not promised, so rows are matched back by ID. The
	// NOTIFY sits in a materialised CTE so it runs once, not once per row.
	rows, err := tx.Query(ctx, `WITH notify AS MATERIALIZED (SELECT pg_notify('`+ChannelEvents+`', '')),
		ins AS (
			INSERT INTO `+qualify(o.Schema, tableName)+` (id, type, subject, payload)
			SELECT id, type, subject, payload::jsonb
			  FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) AS u(id, type, subject, payload)
			RETURNING id, seq, created_at)
		SELECT ins.id, ins.seq, ins.created_at FROM ins CROSS JOIN notify`,
		ids, types, subjects, payloads)
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

// Validate reports whether e can be recorded, with an error wrapping
// [ErrInvalidEvent] that names the offending field. [Record] calls it; hosts
// may call it earlier, for instance to refuse a request before opening a
// transaction.
func Validate(e Event) error {
	if e.ID != uuid.Nil {
		return invalid("ID", "is assigned by Record; leave it zero")
	}
	if e.Seq != 0 || !e.CreatedAt.IsZero() {
		return invalid("Seq", "Seq and CreatedAt are assigned by the database; leave them zero")
	}
	if err := ValidateType(e.Type); err != nil {
		return err
	}
	if len(e.Subject) > MaxSubjectLength {
		return invalid("Subject", fmt.Sprintf("is %d bytes long; the limit is %d", len(e.Subject), MaxSubjectLength))
	}
	if !utf8.ValidString(e.Subject) || strings.IndexByte(e.Subject, 0) >= 0 {
		return invalid("Subject", "must be valid UTF-8 without NUL bytes")
	}
	if len(e.Payload) > MaxPayloadBytes {
		return invalid("Payload", fmt.Sprintf("is %d bytes long; the limit is %d", len(e.Payload), MaxPayloadBytes))
	}
	if len(e.Payload) > 0 {
		if err := validateJSON(e.Payload); err != nil {
			return invalid("Payload", err.Error())
		}
	}
	return nil
}

// ValidateType reports whether t is a well-formed event type: dot-separated
// segments of ASCII letters, digits, '_' and '-', at most [MaxTypeLength]
// bytes. The error wraps [ErrInvalidEvent].
func ValidateType(t string) error {
	if t == "" {
		return invalid("Type", "is empty")
	}
	if len(t) > MaxTypeLength {
		return invalid("Type", fmt.Sprintf("is %d bytes long; the limit is %d", len(t), MaxTypeLength))
	}
	for i, seg := range strings.Split(t, ".") {
		if !glob.ValidSegment(seg) {
			return invalid("Type", fmt.Sprintf("%q: segment %d %q must be a non-empty run of ASCII letters, digits, '_' or '-'", t, i+1, seg))
		}
	}
	return nil
}

func invalid(field, msg string) error {
	return fmt.Errorf("%w: %s %s", ErrInvalidEvent, field, msg)
}

// validateJSON accepts what PostgreSQL's jsonb accepts: valid JSON in valid
// UTF-8, without \u0000 and without unpaired surrogate escapes (encoding/json
// lets both through; jsonb refuses them, which would abort the host's
// transaction).
func validateJSON(b []byte) error {
	if !utf8.Valid(b) {
		return errors.New("is not valid UTF-8")
	}
	if !json.Valid(b) {
		return errors.New("is not valid JSON")
	}
	for i := 0; i < len(b); i++ {
		if b[i] == '-' || '0' <= b[i] && b[i] <= '9' {
			n, err := checkNumber(b[i:])
			if err != nil {
				return err
			}
			i += n - 1
			continue
		}
		if b[i] != '"' {
			continue
		}
		// Inside a string: walk its escapes.
		for i++; i < len(b) && b[i] != '"'; i++ {
			if b[i] != '\\' {
				continue
			}
			i++
			if b[i] != 'u' {
				continue
			}
			r := hex4(b[i+1 : i+5])
			i += 4
			switch {
			case r == 0:
				return errors.New(`contains \u0000, which PostgreSQL's jsonb cannot store`)
			case 0xDC00 <= r && r <= 0xDFFF:
				return errors.New("contains an unpaired low surrogate escape")
			case 0xD800 <= r && r <= 0xDBFF:
				if i+6 >= len(b) || b[i+1] != '\\' || b[i+2] != 'u' {
					return errors.New("contains an unpaired high surrogate escape")
				}
				lo := hex4(b[i+3 : i+7])
				if lo < 0xDC00 || lo > 0xDFFF {
					return errors.New("contains an unpaired high surrogate escape")
				}
				i += 6
			}
		}
	}
	return nil
}

// PostgreSQL's numeric limits: digits before the decimal point, and after it.
const (
	numericMaxWeight = 131072
	numericMaxScale  = 16383
)

// checkNumber checks the JSON number at the start of b (json.Valid has
// checked its syntax) against the range of PostgreSQL's numeric, which jsonb
// stores numbers in: 1e131072 or 1e-16384 would abort the host's
// transaction. It returns the number's length.
func checkNumber(b []byte) (int, error) {
	i := 0
	if b[i] == '-' {
		i++
	}
	intDigits, fracDigits, zero := 0, 0, true
	for ; i < len(b) && '0' <= b[i] && b[i] <= '9'; i++ {
		if b[i] != '0' || !zero {
			intDigits++ // significant digits only
			zero = false
		}
	}
	if i < len(b) && b[i] == '.' {
		for i++; i < len(b) && '0' <= b[i] && b[i] <= '9'; i++ {
			fracDigits++
			if b[i] != '0' {
				zero = false
			}
		}
	}
	exp := 0
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		neg := false
		if b[i] == '+' || b[i] == '-' {
			neg = b[i] == '-'
			i++
		}
		for ; i < len(b) && '0' <= b[i] && b[i] <= '9'; i++ {
			if exp < 1_000_000 {
				exp = exp*10 + int(b[i]-'0')
			}
		}
		if neg {
			exp = -exp
		}
	}
	if zero {
		if exp > numericMaxWeight || exp < -numericMaxWeight {
			return 0, errors.New("holds a number whose exponent PostgreSQL's numeric cannot store")
		}
		return i, nil
	}
	if intDigits+exp > numericMaxWeight || fracDigits-exp > numericMaxScale {
		return 0, errors.New("holds a number outside the range of PostgreSQL's numeric (jsonb)")
	}
	return i, nil
}

// hex4 decodes four hex digits; json.Valid has already checked them.
func hex4(b []byte) rune {
	v, _ := strconv.ParseUint(string(b), 16, 32)
	return rune(v)
}

// RecordedInTx returns the events that tx's transaction has recorded so far
// — by Record, RecordMany, the SQL function outbox_record or a watch trigger
// (see [InstallWatch]) — oldest first. It is how a writer learns the IDs of
// events its triggers made, to wait for them with [Awaiter.AwaitFanout]
// after commit. It reads only pending rows, through the relay's index.
func RecordedInTx(ctx context.Context, tx pgx.Tx) ([]Event, error) {
	return Outbox{}.RecordedInTx(ctx, tx)
}

// RecordedInTx is [RecordedInTx] in o's schema.
func (o Outbox) RecordedInTx(ctx context.Context, tx pgx.Tx) ([]Event, error) {
	if err := validateSchema(o.Schema); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, "SELECT seq, id, type, subject, payload, created_at FROM "+qualify(o.Schema, tableName)+
		" WHERE fanned_out_at IS NULL AND poisoned_at IS NULL AND xact_id = pg_current_xact_id_if_assigned() ORDER BY seq")
	if err != nil {
		return nil, fmt.Errorf("events: recorded in tx: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Event, error) {
		var e Event
		err := row.Scan(&e.Seq, &e.ID, &e.Type, &e.Subject, &e.Payload, &e.CreatedAt)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("events: recorded in tx: %w", err)
	}
	return out, nil
}
