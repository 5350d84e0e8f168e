package glob

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern string
		typ     string
		want    bool
	}{
		{"corpus.note.changed", "corpus.note.changed", true},
		{"corpus.note.changed", "corpus.note.created", false},
		{"corpus.note.changed", "corpus.note", false},
		{"corpus.note.changed", "corpus.note.changed.x", false},
		{"corpus.note.*", "corpus.note.changed", true},
		{"corpus.note.*", "corpus.note", false},
		{"corpus.note.*", "corpus.note.a.b", false},
		{"corpus.*.changed", "corpus.note.changed", true},
		{"corpus.*.changed", "corpus.note.deleted", false},
		{"*", "supplier", true},
		{"*", "supplier.connected", false},
		{"supplier.**", "supplier", true},
		{"supplier.**", "supplier.connected", true},
		{"supplier.**", "supplier.a.b.c", true},
		{"supplier.**", "suppliers.connected", false},
		{"supplier.**", "corpus.supplier", false},
		{"**", "a", true},
		{"**", "a.b.c", true},
		{"**.deleted", "deleted", true},
		{"**.deleted", "corpus.note.deleted", true},
		{"**.deleted", "corpus.note.deleted.not", false},
		{"a.**.z", "a.z", true},
		{"a.**.z", "a.b.c.z", true},
		{"a.**.z", "a.b.c", false},
		{"a.**.*", "a", false},
		{"a.**.*", "a.b", true},
		{"Note", "note", false},
	}
	for _, tt := range tests {
		t.Run(tt.pattern+"~"+tt.typ, func(t *testing.T) {
			p, err := Compile(tt.pattern)
			require.NoError(t, err)
			require.Equal(t, tt.want, p.Match(tt.typ))
		})
	}
}

// Many "**" against a long type that does not match must not take
// exponential time.
func TestMatchIsNotExponential(t *testing.T) {
	t.Parallel()
	p, err := Compile(strings.Repeat("**.a.", 30) + "b")
	require.NoError(t, err)
	typ := strings.TrimSuffix(strings.Repeat("a.", 200), ".")
	done := make(chan bool)
	go func() { done <- p.Match(typ) }()
	select {
	case got := <-done:
		require.False(t, got)
	case <-time.After(30 * time.Second):
		t.Fatal("matching took more than 30 s (backtracking)")
	}
}

func TestCompileRejects(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"", ".", "a.", ".a", "a..b", "note*", "a.*b", "***", "a b", "a.ü", "a/b"} {
		_, err := Compile(bad)
		require.Error(t, err, "pattern %q", bad)
	}
}

// Regexp matches exactly what Match matches.
func TestRegexpAgreesWithMatch(t *testing.T) {
	types := []string{"a", "b", "a.b", "a.b.c", "a.x.c", "note.changed", "corpus.note.changed", "supplier", "supplier.a.b", "deleted", "x-y.z_1"}
	for _, pat := range []string{"a", "*", "**", "a.*", "a.**", "**.c", "*.b.*", "a.**.c", "corpus.note.*", "supplier.**", "**.deleted", "x-y.*", "**.*.**"} {
		p, err := Compile(pat)
		if err != nil {
			t.Fatal(err)
		}
		re := regexp.MustCompile(p.Regexp())
		for _, typ := range types {
			if got, want := re.MatchString("."+typ), p.Match(typ); got != want {
				t.Errorf("pattern %q, type %q: Regexp %v, Match %v (%s)", pat, typ, got, want, p.Regexp())
			}
		}
	}
}
