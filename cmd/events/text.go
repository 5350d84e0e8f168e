package main

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Subjects, errors, payloads and even table names come from outside: a
// subject recorded as "\x1b]0;owned\a" must not retitle the operator's
// terminal, nor "\x1b[2J" clear it. Table output shows such bytes as Go
// escapes; JSON output (for scripts) keeps them exactly, escaped as JSON
// escapes them.

// clean returns s fit for a terminal: every rune that is not graphic (C0 and
// C1 controls, DEL, bidirectional overrides, invalid UTF-8) is written as a
// Go escape (\a, \n, \x1b, \u202e), and a backslash as \\ so that an escape
// shown is never a backslash the data held.
func clean(s string) string { return escape(s, -1, true) }

// cell is clean(s), cut to at most max runes (max < 0: no limit). A cut
// string ends in "…" and is never cut inside a rune or inside an escape.
func cell(s string, max int) string { return escape(s, max, true) }

// escape is cell, escaping backslashes or not.
func escape(s string, max int, backslash bool) string {
	if !needsEscape(s, backslash) && (max < 0 || utf8.RuneCountInString(s) <= max) {
		return s
	}
	var b strings.Builder
	width := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		piece := escapeRune(r, s[i:i+size], backslash)
		i += size
		w := utf8.RuneCountInString(piece)
		if max >= 0 {
			// Leave room for the ellipsis unless this is the last piece and
			// it fits.
			room := max - width
			if i < len(s) {
				room--
			}
			if w > room {
				b.WriteString("…")
				return b.String()
			}
		}
		b.WriteString(piece)
		width += w
	}
	return b.String()
}

// needsEscape reports whether escape would change s.
func needsEscape(s string, backslash bool) bool {
	for _, r := range s {
		if (backslash && r == '\\') || r == utf8.RuneError || !printable(r) {
			return true
		}
	}
	return false
}

func printable(r rune) bool { return r == ' ' || unicode.IsGraphic(r) }

// escapeRune returns r (whose bytes are raw) as it shows on a terminal.
func escapeRune(r rune, raw string, backslash bool) string {
	switch {
	case r == utf8.RuneError && len(raw) == 1:
		return fmt.Sprintf(`\x%02x`, raw[0])
	case r == '\\' && backslash:
		return `\\`
	case printable(r):
		return raw
	}
	switch r {
	case '\a':
		return `\a`
	case '\b':
		return `\b`
	case '\f':
		return `\f`
	case '\n':
		return `\n`
	case '\r':
		return `\r`
	case '\t':
		return `\t`
	case '\v':
		return `\v`
	}
	switch {
	case r < 0x80:
		return fmt.Sprintf(`\x%02x`, r)
	case r < 0x10000:
		return fmt.Sprintf(`\u%04x`, r)
	default:
		return fmt.Sprintf(`\U%08x`, r)
	}
}

// cleanJSON is clean for pretty-printed JSON (a payload): line breaks are
// kept, and so are backslashes, which JSON already uses for its own escapes
// (a payload cannot hold a raw C0 control; it can hold a raw C1 control or a
// bidi override, which are escaped).
func cleanJSON(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = escape(l, -1, false)
	}
	return strings.Join(lines, "\n")
}
