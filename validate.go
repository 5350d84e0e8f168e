package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/standmeet/events/internal/glob"
)

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
	if len(e.Scope) > MaxScopeLength {
		return invalid("Scope", fmt.Sprintf("is %d bytes long; the limit is %d", len(e.Scope), MaxScopeLength))
	}
	if !utf8.ValidString(e.Scope) || strings.IndexByte(e.Scope, 0) >= 0 {
		return invalid("Scope", "must be valid UTF-8 without NUL bytes")
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
	return &ValidationError{Kind: ErrInvalidEvent, Field: field, Reason: msg}
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
