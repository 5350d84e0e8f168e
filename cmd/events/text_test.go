package main

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestCleanEscapesWhatDrivesATerminal(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"note:1":                     "note:1",
		"note:\x1b[2J":               `note:\x1b[2J`,        // clear screen
		"\x1b]0;owned\a":             `\x1b]0;owned\a`,      // OSC: retitle, ended by BEL
		"a\tb\nc\rd\x00e\x7f":        `a\tb\nc\rd\x00e\x7f`, // C0 and DEL
		"\u009b31m":                  `\u009b31m`,           // C1 CSI
		"abc\u202edef":               `abc\u202edef`,        // bidi override
		`C:\temp`:                    `C:\\temp`,            // a backslash is never mistaken for an escape
		"bad \xff byte":              `bad \xff byte`,       // invalid UTF-8
		"schön, 日本, emoji 🎉, spaces": "schön, 日本, emoji 🎉, spaces",
	} {
		require.Equal(t, want, clean(in), "%q", in)
	}
}

func TestCellCutsOnRunesNotBytes(t *testing.T) {
	t.Parallel()
	require.Equal(t, "short", cell("short", 10))
	require.Equal(t, "exactly10!", cell("exactly10!", 10))
	require.Equal(t, "ünïcödé …", cell("ünïcödé über alles", 9))
	require.Equal(t, "日本語…", cell("日本語のテキスト", 4))
	// Never inside an escape: the cut falls before \x1b, not within it.
	require.Equal(t, "ab…", cell("ab\x1b[2J", 5))
	require.Equal(t, `ab\x1b…`, cell("ab\x1b[2J", 7))
	// Every cut of a multi-byte string is valid UTF-8 and no wider than asked.
	s := strings.Repeat("ü日🎉\x1b", 20)
	for n := 1; n < 120; n++ {
		got := cell(s, n)
		require.True(t, utf8.ValidString(got), "width %d: %q", n, got)
		require.LessOrEqual(t, utf8.RuneCountInString(got), n, "width %d: %q", n, got)
		require.NotContains(t, got, "\x1b", "width %d", n)
	}
}
