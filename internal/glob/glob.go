// Package glob matches dot-separated event types against subscription
// patterns.
//
// A pattern is a dot-separated list of segments. A literal segment matches
// the same segment exactly; "*" matches exactly one segment; "**" matches
// zero or more segments. Wildcards stand only as whole segments: "note*" is
// not a pattern.
//
//	corpus.note.*   matches corpus.note.changed, not corpus.note or corpus.note.a.b
//	supplier.**     matches supplier, supplier.connected, supplier.a.b
//	**.deleted      matches deleted, note.deleted, corpus.note.deleted
//	**              matches everything
package glob

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Pattern is a compiled glob.
type Pattern struct {
	raw      string
	segments []string
}

// Compile parses a pattern, rejecting empty segments and partial wildcards.
func Compile(pattern string) (Pattern, error) {
	if pattern == "" {
		return Pattern{}, errors.New("empty pattern")
	}
	segs := strings.Split(pattern, ".")
	for i, s := range segs {
		switch {
		case s == "":
			return Pattern{}, fmt.Errorf("pattern %q: empty segment %d", pattern, i+1)
		case s == "*" || s == "**":
		case strings.Contains(s, "*"):
			return Pattern{}, fmt.Errorf("pattern %q: segment %q: a wildcard must be a whole segment (* or **)", pattern, s)
		case !ValidSegment(s):
			return Pattern{}, fmt.Errorf("pattern %q: segment %q: only letters, digits, '_' and '-' are allowed", pattern, s)
		}
	}
	return Pattern{raw: pattern, segments: segs}, nil
}

// String returns the pattern as written.
func (p Pattern) String() string { return p.raw }

// Match reports whether the dot-separated type t matches the pattern.
func (p Pattern) Match(t string) bool {
	return match(p.segments, strings.Split(t, "."))
}

// match is the classic two-pointer wildcard match, with "*" standing for one
// segment (like ? for characters) and "**" for any run of them (like *): on a
// mismatch it backtracks only to the latest "**", so it takes at most
// len(pat)×len(segs) steps, never exponential time.
func match(pat, segs []string) bool {
	p, s := 0, 0
	star, starS := -1, 0 // index of the latest "**" in pat, and where in segs it began
	for s < len(segs) {
		switch {
		case p < len(pat) && pat[p] == "**":
			star, starS = p, s
			p++
		case p < len(pat) && (pat[p] == "*" || pat[p] == segs[s]):
			p++
			s++
		case star >= 0:
			// Let the latest "**" swallow one more segment and retry.
			starS++
			p, s = star+1, starS
		default:
			return false
		}
	}
	for p < len(pat) && pat[p] == "**" {
		p++
	}
	return p == len(pat)
}

// ValidSegment reports whether s is a non-empty run of ASCII letters, digits,
// '_' and '-': the alphabet of event type segments.
func ValidSegment(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// Regexp returns a regular expression (POSIX ARE, as PostgreSQL's ~ reads
// it, and Go's regexp too) that matches "." followed by the types the
// pattern matches: compare it with ('.' || type) in SQL.
func (p Pattern) Regexp() string {
	var b strings.Builder
	b.WriteString("^")
	for _, s := range p.segments {
		switch s {
		case "*":
			b.WriteString(`\.[^.]+`)
		case "**":
			b.WriteString(`(?:\.[^.]+)*`)
		default:
			b.WriteString(`\.`)
			b.WriteString(regexp.QuoteMeta(s))
		}
	}
	b.WriteString("$")
	return b.String()
}
