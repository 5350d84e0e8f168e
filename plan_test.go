package events

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"
)

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

// InsertOpts() is called by the relay itself (plan.go insertOpts) to
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
