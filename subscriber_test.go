package events

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/glob"
)

// Subscribe accepts exactly the names whose job tag River accepts, within the
// library's own stricter rules (lowercase, at most 64 characters).
func TestSubscriberNamesAreTheOnesRiverAcceptsAsTags(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	riverAccepts := func(name string) bool {
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := b.client.InsertTx(ctx, tx, testArgs{}, &river.InsertOpts{Tags: []string{tagSubscriber + name}})
			if err != nil {
				return err
			}
			return errRollback
		})
		return errors.Is(err, errRollback)
	}
	long := func(n int) string { return fmt.Sprintf("%0*d", n, 7) }
	for _, name := range []string{"a", "_", "0", "a_", "a-b", "-a", "_-_", "a--b", long(64), // accepted
		"", "-", "a-", "--", "ab-", "a.b", "a b", "é", "a\n"} { // refused by River too
		_, err := newSubscription(mapSub(name, false, "**"))
		require.Equal(t, riverAccepts(name), err == nil, "name %q: Subscribe says %v", name, err)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidSubscriber)
			require.Contains(t, err.Error(), "Name")
		}
	}
	// The library's own, stricter rules.
	for _, name := range []string{long(65), "A", "a-B"} {
		_, err := newSubscription(mapSub(name, false, "**"))
		require.ErrorIs(t, err, ErrInvalidSubscriber, name)
	}
}

// FuzzGlobMatch checks that pattern compilation never panics and that
// matching agrees with a few laws: a literal pattern matches exactly itself,
// "**" matches every type, and "*" stands for exactly one segment.
func FuzzGlobMatch(f *testing.F) {
	for _, seed := range [][2]string{
		{"corpus.note.*", "corpus.note.changed"},
		{"supplier.**", "supplier"},
		{"**.deleted", "a.b.deleted"},
		{"a.**.z", "a.z"},
		{"*", "a.b"},
		{"a..b", "a.b"},
		{"note*", "note"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, pattern, typ string) {
		p, err := glob.Compile(pattern)
		if ValidateType(typ) != nil {
			return
		}
		all, _ := glob.Compile("**")
		if !all.Match(typ) {
			t.Fatalf("** does not match %q", typ)
		}
		lit, err2 := glob.Compile(typ)
		if err2 != nil || !lit.Match(typ) {
			t.Fatalf("the literal pattern %q does not match itself: %v", typ, err2)
		}
		if err != nil {
			return
		}
		matched := p.Match(typ)
		if !strings.Contains(pattern, "*") && matched != (pattern == typ) {
			t.Fatalf("literal pattern %q vs %q: match %v", pattern, typ, matched)
		}
		one, _ := glob.Compile(strings.Repeat("*.", strings.Count(typ, ".")) + "*")
		if !one.Match(typ) {
			t.Fatalf("one * per segment does not match %q", typ)
		}
	})
}
