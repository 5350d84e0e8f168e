package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/testdb"
)

// A discarded head of an ordered subscriber blocks its subject: the CLI
// shows it (stats, chains --blocked, --json), resumes it (the head is
// retried and the rest follow), and skips it (the head is given up and the
// next runs).
func TestChainsBlockedResumeAndSkip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	pool := testdb.Pool(t, url)
	var (
		mu      sync.Mutex
		failing = map[string]bool{`{"bad": 1}`: true, `{"bad": 2}`: true}
		handled []uuid.UUID
	)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	relay, err := events.NewRelay(pool, &events.RelayConfig{Logger: quiet})
	require.NoError(t, err)
	require.NoError(t, relay.Subscribe(events.Subscriber{Name: "ledger", Types: []string{"**"}, Ordered: true,
		InsertOpts: &river.InsertOpts{MaxAttempts: 1},
		Handle: func(_ context.Context, e events.Event) error {
			mu.Lock()
			defer mu.Unlock()
			if failing[string(e.Payload)] {
				return errors.New("ledger closed for the night")
			}
			handled = append(handled, e.ID)
			return nil
		}}))
	workers := river.NewWorkers()
	require.NoError(t, relay.AddWorkers(workers))
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quiet, Workers: workers,
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 5}},
		FetchCooldown: 5 * time.Millisecond, FetchPollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	require.NoError(t, relay.Start(ctx, client))
	t.Cleanup(func() {
		stop, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, relay.Stop(stop))
		require.NoError(t, client.Stop(stop))
	})
	record := func(payloads ...string) []uuid.UUID {
		var ids []uuid.UUID
		for _, p := range payloads {
			require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				e, err := events.Record(ctx, tx, events.Event{Type: "entry.posted", Subject: "account:7", Payload: []byte(p)})
				ids = append(ids, e.ID)
				return err
			}))
		}
		return ids
	}
	handledNow := func() []uuid.UUID {
		mu.Lock()
		defer mu.Unlock()
		return append([]uuid.UUID(nil), handled...)
	}
	blocked := func() bool {
		st, err := events.Outbox{}.GetStats(ctx, pool)
		require.NoError(t, err)
		return st.BlockedChains == 1
	}

	first := record(`{"bad":1}`, `{"i":1}`, `{"i":2}`)
	require.Eventually(t, blocked, 20*time.Second, 10*time.Millisecond)
	code, out, _ := runCLI(t, url, "", "stats")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "blocked subjects         1  (ordered subjects waiting for an operator: see events chains --blocked)")
	code, out, _ = runCLI(t, url, "", "chains", "--blocked")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "BLOCKED (discarded)")
	require.Contains(t, out, "account:7")
	require.Contains(t, out, first[0].String())
	require.Contains(t, out, "ledger closed for the night")
	code, out, _ = runCLI(t, url, "", "--json", "chains")
	require.Equal(t, exitOK, code)
	var page struct {
		Chains []struct {
			Subscriber   string    `json:"subscriber"`
			Subject      string    `json:"subject"`
			HeadEventID  uuid.UUID `json:"head_event_id"`
			Jobs         int64     `json:"jobs"`
			BlockedState string    `json:"blocked_state"`
		} `json:"chains"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &page))
	require.Len(t, page.Chains, 1)
	require.Equal(t, "ledger", page.Chains[0].Subscriber)
	require.Equal(t, first[0], page.Chains[0].HeadEventID)
	require.EqualValues(t, 3, page.Chains[0].Jobs, "the head and two waiting behind it")
	require.Equal(t, "discarded", page.Chains[0].BlockedState)
	require.Empty(t, handledNow())

	// Mistakes: exit 2 for a usage error, 1 for a chain that is not there.
	code, _, _ = runCLI(t, url, "", "chains", "skip", "ledger")
	require.Equal(t, exitUsage, code)
	code, _, errOut := runCLI(t, url, "", "chains", "resume", "ledger", "account:9")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "no such chain")

	// Resume, once it works: the head, then the rest, in order.
	mu.Lock()
	failing[`{"bad": 1}`] = false
	mu.Unlock()
	code, out, _ = runCLI(t, url, "", "chains", "resume", "ledger", "account:7")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "resumed")
	require.Eventually(t, func() bool { return len(handledNow()) == 3 }, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, first, handledNow())
	code, _, errOut = runCLI(t, url, "", "chains", "skip", "ledger", "account:7")
	require.Equal(t, exitError, code, "nothing is blocked any more")
	require.Contains(t, errOut, "no such chain")

	// Skip: the head is given up, the next one runs.
	second := record(`{"bad":2}`, `{"i":3}`)
	require.Eventually(t, blocked, 20*time.Second, 10*time.Millisecond)
	code, out, _ = runCLI(t, url, "", "chains", "skip", "ledger", "account:7")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "skipped")
	require.Eventually(t, func() bool { return len(handledNow()) == 4 }, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, append(first, second[1]), handledNow())
	// The handler has run; its job's completion (which ends the chain)
	// commits just after.
	require.Eventually(t, func() bool {
		code, out, _ = runCLI(t, url, "", "chains")
		return code == exitOK && strings.Contains(out, "no subject waiting")
	}, 20*time.Second, 10*time.Millisecond, "the chain of account:7 never ended")
}
