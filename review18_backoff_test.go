package events

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A relay's backoff after a failed round ends when the listener reconnects
// (issue 18), but the listener's very first connect leaves a token in the
// reconnected channel that nothing consumes: the run's first failed round
// does not back off at all, whatever RetryBackoff says (and every later
// reconnect leaves another token for the next, unrelated failure).
func TestTheFirstFailedRoundWaitsItsBackoff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{config: &RelayConfig{RetryBackoff: time.Minute, MaxRetryBackoff: time.Minute}},
		mapSub("audit", false, "**"))
	b.start(t)
	b.settle(t)
	// Every insert into river_job fails (not a connection error), and is
	// counted by a sequence, which the failing transaction cannot roll back.
	exec(t, b.pool, "CREATE SEQUENCE job_inserts")
	exec(t, b.pool, `CREATE FUNCTION refuse_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM nextval('job_inserts'); RAISE EXCEPTION 'refused'; END $$`)
	exec(t, b.pool, "CREATE TRIGGER refuse_jobs BEFORE INSERT ON river_job FOR EACH STATEMENT EXECUTE FUNCTION refuse_jobs()")
	attempts := func() int64 {
		var n int64
		require.NoError(t, b.pool.QueryRow(ctx,
			"SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM job_inserts").Scan(&n))
		return n
	}
	b.record(t, Event{Type: "a"})
	require.Eventually(t, func() bool { return attempts() >= 1 }, 10*time.Second, 5*time.Millisecond,
		"the relay never tried the event")
	require.Never(t, func() bool { return attempts() >= 2 }, 2*time.Second, 10*time.Millisecond,
		"the relay tried again at once after its first failed round; RetryBackoff is a minute")
}
