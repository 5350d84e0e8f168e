package safetext

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestClip(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, in string
		limit    int
		want     string
	}{
		{"valid and short is unchanged", "template missing: é", 100, "template missing: é"},
		{"exactly the limit is unchanged", "abcd", 4, "abcd"},
		{"NUL is escaped", "bad\x00byte", 100, `bad\x00byte`},
		{"invalid bytes are escaped", "a\xffb\xc3", 100, `a\xffb\xc3`},
		{"a low invalid byte keeps two hex digits", "\x80\x01", 100, `\x80` + "\x01"},
		// msg[:5] would split the é (bytes 4 and 5); the cut leaves it out
		// whole and marks the cut.
		{"cut on a rune boundary", "abcdéfghij", 8, "abcd" + Ellipsis},
		{"a cut never splits an escape", "ab\x00cdefgh", 8, "ab" + Ellipsis},
		{"escaping can make it too long", "\x00\x00\x00", 8, `\x00` + Ellipsis},
		{"a limit too small for the mark", "abcdef", 2, "ab"},
		{"zero limit", "abc", 0, ""},
		{"empty", "", 10, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, Clip(tt.in, tt.limit))
		})
	}
}

func TestClipLargeInputStopsAtTheLimit(t *testing.T) {
	t.Parallel()
	in := strings.Repeat("ü\x00", 1<<19) // 1.5 MB
	out := Clip(in, 2000)
	require.LessOrEqual(t, len(out), 2000)
	require.True(t, strings.HasSuffix(out, Ellipsis))
	require.True(t, strings.HasPrefix(out, `ü\x00ü\x00`))
	require.True(t, utf8.ValidString(out))
}

// FuzzClip checks the promise for any input: valid UTF-8, no NUL, within the
// limit; unchanged when already safe; otherwise a prefix of the whole
// escaped text, marked when cut.
func FuzzClip(f *testing.F) {
	for _, s := range []string{"", "plain", "bad\x00byte", "\xff\xfe", "abcdéfghij", strings.Repeat("é", 1500),
		strings.Repeat("a", 1999) + "é", "日本語\x00\x80", "\U0001F600\U0001F600"} {
		for _, limit := range []int{0, 2, 3, 4, 8, 2000} {
			f.Add(s, limit)
		}
	}
	f.Fuzz(func(t *testing.T, s string, limit int) {
		limit = limit % 5000
		out := Clip(s, limit)
		if !utf8.ValidString(out) {
			t.Fatalf("Clip(%q, %d) = %q: not valid UTF-8", s, limit, out)
		}
		if strings.IndexByte(out, 0) >= 0 {
			t.Fatalf("Clip(%q, %d) = %q: has NUL", s, limit, out)
		}
		if len(out) > max(limit, 0) {
			t.Fatalf("Clip(%q, %d) = %q: %d bytes", s, limit, out, len(out))
		}
		if len(s) <= limit && utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 && out != s {
			t.Fatalf("Clip(%q, %d) = %q: safe text changed", s, limit, out)
		}
		whole := Clip(s, len(s)*4+len(Ellipsis)) // every byte escaped fits
		if out != whole {
			kept, marked := strings.CutSuffix(out, Ellipsis)
			if limit >= len(Ellipsis) && !marked {
				t.Fatalf("Clip(%q, %d) = %q: cut without the mark", s, limit, out)
			}
			if !strings.HasPrefix(whole, kept) {
				t.Fatalf("Clip(%q, %d) = %q: not a prefix of %q", s, limit, out, whole)
			}
		}
	})
}
