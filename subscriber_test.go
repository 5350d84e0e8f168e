package events

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/engine"
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
			_, err := b.client.InsertTx(ctx, tx, testArgs{}, &river.InsertOpts{Tags: []string{engine.TagSubscriber + name}})
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

// Job args whose own methods panic fail their pair, not the relay: the relay
// reads Kind and InsertOpts at plan time, River marshals inside its insert
// (insertMany recovers, and the batch is retried job by job). The pair is
// poisoned, the other subscriber and the other events go on.
func TestJobArgsPanickingAreChargedToTheirPair(t *testing.T) {
	t.Parallel()
	for method, want := range map[string]string{
		"kind":    `"panics": the job args' Kind or InsertOpts panicked: panicArgs: Kind panicked`,
		"opts":    `"panics": the job args' Kind or InsertOpts panicked: panicArgs: InsertOpts panicked`,
		"marshal": "River's insert (the job args' methods, insert hooks or middleware) panicked: panicArgs: MarshalJSON panicked",
	} {
		t.Run(method, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{config: &RelayConfig{RetryBackoff: 5 * time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond, MaxAttempts: 2}},
				panicSub("panics", false, false), mapSub("audit", false, "**"))
			es := make([]Event, 10)
			for i := range es {
				es[i] = panicEvent(fmt.Sprintf("ok-%d", i), "")
			}
			es[4] = panicEvent("boom", method)
			es = b.record(t, es...)
			b.start(t)
			waitDelivered(t, b.pool, 20*time.Second)
			rows, pairs := loadRows(t, b.pool), loadPairs(t, b.pool)
			for i, e := range es {
				require.True(t, rows[e.ID].FannedOut, "event %d", i)
				require.Contains(t, rows[e.ID].Fanout, "audit", "event %d", i)
				if i == 4 {
					require.True(t, pairs[e.ID]["panics"].Poisoned)
					require.Contains(t, pairs[e.ID]["panics"].LastError, want)
					continue
				}
				require.Contains(t, rows[e.ID].Fanout, "panics", "event %d", i)
				require.Empty(t, pairs[e.ID], "event %d was charged for another's failure", i)
			}
			require.Len(t, loadJobs(t, b.pool), 19)
		})
	}
}

// InsertOpts() is called by the relay itself (internal/engine's plan.go, insertOpts) to
// build InsertManyParams, before insertMany's recover is in place.
func TestPanicInsertOptsInFanoutTx(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, panicSub("opts", false, false), mapSub("audit", false, "**"))
	es := b.record(t, panicEvent("ok", ""), panicEvent("boom", "opts"))
	_, err := fanoutTxOnce(t, b)
	require.NoError(t, err)
	rows, pairs := loadRows(t, b.pool), loadPairs(t, b.pool)
	require.Contains(t, rows[es[0].ID].Fanout, "opts")
	require.Contains(t, rows[es[1].ID].Fanout, "audit")
	require.Contains(t, pairs[es[1].ID]["opts"].LastError, "InsertOpts panicked")
}

// Once the relay is stopping, the round calls no more host code: a mapper
// that ignores its context is not called again after Stop's context ended.
func TestStoppingStopsCallingMap(t *testing.T) {
	t.Parallel()
	calls := make(chan struct{}, 1000)
	release := make(chan struct{})
	b := setup(t, setupOpts{config: &RelayConfig{BatchSize: 500}}, Subscriber{Name: "slow", Types: []string{"**"},
		Map: func(context.Context, Event) (river.JobArgs, *river.InsertOpts, error) {
			calls <- struct{}{}
			<-release // ignores its context
			return testArgs{}, nil, nil
		}})
	es := make([]Event, 300)
	for i := range es {
		es[i] = Event{Type: "a"}
	}
	b.record(t, es...)
	require.NoError(t, b.relay.Start(context.Background(), b.client))
	<-calls
	stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	stopped := make(chan error)
	go func() { stopped <- b.relay.Stop(stopCtx) }()
	<-stopCtx.Done()
	close(release) // the first Map returns, long after Stop's deadline
	require.ErrorIs(t, <-stopped, context.DeadlineExceeded)
	require.Empty(t, calls, "Map was called again after the relay was stopping")
	for _, r := range loadRows(t, b.pool) {
		require.False(t, r.FannedOut)
		require.Zero(t, r.Attempts, "a stop is charged to no event")
	}
}
