// Package safetext makes text that comes from outside the library (a host's
// error, a receiver's answer) safe to store in a PostgreSQL text column and
// to print: PostgreSQL refuses invalid UTF-8 and NUL bytes (SQLSTATE 22021),
// and a message of unbounded length must not become a row of unbounded size.
package safetext

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Ellipsis ends text that [Clip] cut short.
const Ellipsis = "…"

// Clip returns s as valid UTF-8 without NUL bytes, at most limit bytes long.
//
// A NUL byte becomes the four characters `\x00` and every byte that is not
// part of valid UTF-8 becomes `\xNN` (its value in hex), so the reader still
// sees what was there; the escapes are for reading, not decoding (a `\x`
// already in s is left as it is). Text longer than limit after escaping is
// cut on a rune boundary, never inside an escape, and ends with [Ellipsis]
// (counted in limit), so a cut is visible. A limit below len(Ellipsis) cuts
// without the mark. Valid text within limit is returned unchanged.
func Clip(s string, limit int) string {
	limit = max(limit, 0)
	if len(s) <= limit && utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	mark := Ellipsis
	if limit < len(mark) {
		mark = ""
	}
	var b strings.Builder
	b.Grow(min(len(s), limit) + len(mark))
	// cut is the length of b at the last piece boundary that leaves room for
	// the mark: where the text ends if it turns out too long.
	cut := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == 0:
			b.WriteString(`\x00`)
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\x`)
			if s[i] < 0x10 {
				b.WriteByte('0')
			}
			b.WriteString(strconv.FormatUint(uint64(s[i]), 16))
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
		if b.Len() > limit {
			return b.String()[:cut] + mark
		}
		if b.Len() <= limit-len(mark) {
			cut = b.Len()
		}
	}
	return b.String()
}
