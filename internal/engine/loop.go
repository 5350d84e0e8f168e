package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/standmeet/events/internal/backoff"
	"github.com/standmeet/events/internal/wake"
)

// busyTurnInterval is how often a busy relay (full batches, back to back)
// also runs the retries that are due and serves the deliveries lane: a query
// on a small index each when there is nothing to do.
const busyTurnInterval = 250 * time.Millisecond

// The relays' adaptive poll. Watch triggers send no notification (a check
// per row inside the host's transaction cost a tenth of a watched table's
// write throughput), and a throttled notification leaves the transactions
// that commit just after it quiet; so after each wake-up, and each round that
// found rows, the idle relay looks again every firstRecheck for
// steadyRecheck, then after twice as long with every look that finds
// nothing, up to LastRecheck: about a second in all (or less, when
// PollInterval is shorter), then every PollInterval. Each look is one query
// on a small partial index. While writes flow (one every 16 ms or more
// often) they are found within milliseconds; after a longer lull, within
// about as long again as the lull.
const (
	firstRecheck  = 2 * time.Millisecond
	steadyRecheck = 16 * time.Millisecond
	LastRecheck   = 512 * time.Millisecond
)

// stopping reports whether the run is stopping; never for a FanoutTx call.
func (r *Relay) stopping() bool { return r.run.IsStopping() }

// loop is the relay's main loop. It runs rounds until stopped: straight on
// after a full batch (and wakes a helper loop to claim alongside), otherwise
// it serves the deliveries lane and then waits — for a notification, for the
// next re-check after activity (see firstRecheck), or for the next poll,
// which reads in one query whether pending rows wait (watch triggers send no
// notification, and one may have been throttled or lost) and when the next
// failed event is due.
func (r *Relay) loop(ctx context.Context) {
	l := &mainLoop{r: r, claim: true}
	for !r.stopping() && ctx.Err() == nil {
		if l.claim {
			again, ok := l.claimPass(ctx)
			if !ok {
				return
			}
			if again {
				continue
			}
		}
		if !l.idlePass(ctx) {
			return
		}
	}
}

// mainLoop is what the main loop carries from one pass to the next.
type mainLoop struct {
	r         *Relay
	failures  int           // rounds and polls failed in a row
	pollAt    time.Time     // when an idle relay polls next
	turnsAt   time.Time     // when a busy relay gives the other duties their turn next
	lull      time.Duration // how long the idle relay waits before its next re-check (0: no re-checks)
	activeAt  time.Time     // the last wake-up, or round that found rows
	foundNone bool          // the last claim found nothing (the rows the poll saw are locked, or taken)
	owedRan   bool          // the last claim pass ended with a round of the deliveries lane
	claim     bool          // whether the next pass starts with a batch round
	recheck   bool          // the next pass is a re-check (see firstRecheck): poll only
}

// claimPass runs a batch round of the pending lane, then, while the
// deliveries lane has a backlog, one round of it: a short one while fresh
// events flow (owedBatch), when the helper loops leave the backlog to this
// loop. It reports whether to claim again at once (a batch came back full,
// or owed deliveries may still be due, or a batch failed and was retried
// row by row) and whether to go on at all.
func (l *mainLoop) claimPass(ctx context.Context) (again, ok bool) {
	r := l.r
	l.owedRan = false
	listened := r.listening()
	claimed, err := r.round(ctx, LanePending, r.sql.ClaimBatch, int64(r.config.BatchSize))
	if err != nil {
		if !l.failed(ctx, err) {
			return false, false
		}
		// One bad row must not hold back the rest: retry the batch row by
		// row, so the bad one is found and charged alone.
		r.rowByRow(ctx, LanePending, claimed, err)
		return true, true
	}
	l.succeeded()
	if r.Hooks.MainRound != nil {
		r.Hooks.MainRound(LanePending, len(claimed))
	}
	if listened {
		// Listening (or polling only), and caught up with what was there
		// before.
		r.run.MarkReady()
	}
	l.foundNone = len(claimed) == 0
	if !l.foundNone {
		l.active() // writes flow
	}
	r.fresh.claimed(time.Now(), len(claimed))
	full := len(claimed) == r.config.BatchSize
	r.busy.Store(full)
	if full {
		r.helpWake.Send() // plenty of work: a helper loop may join
	}
	// The busy turn's round of the deliveries lane looks for a backlog
	// nobody has found yet; one that is known gets its round below, and two
	// rounds in a row would hold the next fresh event back twice.
	owedDue := r.owedBusy.Load()
	if (full || owedDue) && !l.otherTurns(ctx, !owedDue) {
		return false, false
	}
	if !owedDue {
		return full, true // the idle pass serves the deliveries lane
	}
	// A backlog: its round follows every pending one.
	owed, ok := r.owedPass(ctx, l.failed)
	l.owedRan = true
	if owed && !r.freshFlowing() {
		r.helpWake.Send() // the helper loops join while no fresh events flow
	}
	return full || owed, ok
}

// otherTurns keeps a busy main loop (full batches, or a backlog of owed
// deliveries, back to back: it never idles, where the poll would run them) from
// starving its other duties: four times a second it also runs the retries
// that are due and, with owed, a round of the deliveries lane, to find a
// backlog nobody has found yet (retention runs on its own goroutine and
// takes its own turns). It reports whether to go on.
func (l *mainLoop) otherTurns(ctx context.Context, owed bool) bool {
	if !time.Now().After(l.turnsAt) {
		return true
	}
	l.turnsAt = time.Now().Add(busyTurnInterval)
	if err := l.r.retryDue(ctx); err != nil && !l.failed(ctx, err) {
		return false
	}
	if !owed {
		return true
	}
	_, ok := l.r.owedPass(ctx, l.failed)
	return ok
}

// idlePass follows a batch that was not full: it serves the deliveries lane
// (unless this pass is a re-check, or the claim pass before it ended with a
// round of that lane: two in a row would hold a fresh event back twice),
// polls, and waits — for a notification, the next re-check, or the next
// poll. It sets what the next pass does and reports whether to go on.
func (l *mainLoop) idlePass(ctx context.Context) bool {
	r := l.r
	owedRan := l.owedRan
	l.owedRan = false
	if !l.recheck && !owedRan {
		owed, ok := r.owedPass(ctx, l.failed)
		if !ok {
			return false
		}
		if owed {
			l.claim = true // a backlog: a pending round, then the next owed one
			r.helpWake.Send()
			return true
		}
	}
	if l.recheck {
		l.pollAt = time.Time{} // look now
	}
	next, err := r.poll(ctx, &l.pollAt)
	if err != nil {
		l.claim = true
		return l.failed(ctx, err)
	}
	l.succeeded()
	if next == 0 {
		l.claim, l.recheck = true, false // rows wait, or retries ran
		return true
	}
	// A look that found nothing counts as empty, and so does one whose claim
	// found nothing: rows that another session holds locked (a stuck round,
	// a long FanoutTx) must not keep this relay re-checking every 2 ms.
	if (l.recheck || l.foundNone) && time.Since(l.activeAt) >= steadyRecheck {
		l.lull *= 2 // nothing there for a while: look again later
	}
	rechecking := l.lull > 0 && l.lull <= min(LastRecheck, r.config.PollInterval)
	if rechecking {
		next = min(next, l.lull)
	} else {
		l.lull = 0
	}
	switch {
	case r.wait(ctx, next):
		l.claim, l.recheck = true, false
		l.active()
	case rechecking && time.Until(l.pollAt) > 0:
		l.claim, l.recheck = false, true
	default:
		l.claim, l.recheck = false, false // time to poll
	}
	return true
}

// active starts the re-checks over: a wake-up came, or a round found rows.
func (l *mainLoop) active() {
	l.lull, l.activeAt = firstRecheck, time.Now()
}

// failed counts a failed round or poll and backs off, longer with every
// failure in a row. It reports whether to go on: never once the relay is
// stopping.
func (l *mainLoop) failed(ctx context.Context, err error) bool {
	r := l.r
	if r.stopping() || ctx.Err() != nil {
		return false
	}
	l.failures++
	r.failing.Store(int32(min(l.failures, 1<<30)))
	d := backoff.Delay(l.failures, r.config.RetryBackoff, r.config.MaxRetryBackoff)
	if IsTransient(err) {
		// The database is away (a restart, a failover): looking again costs
		// a connection attempt, so look at least every poll interval, and at
		// once when the listener is back. A crash may have lost rounds'
		// commits that moved the claim floor: look below it once back.
		d = min(d, r.config.PollInterval)
		r.lookBelowSoon()
	}
	r.config.Logger.WarnContext(ctx, "events: relay round failed; backing off",
		slog.String("err", err.Error()), slog.Int("failures", l.failures), slog.Duration("pause", d))
	return r.pause(ctx, d, r.reconnected)
}

// succeeded clears the failures after a round or poll that worked.
func (l *mainLoop) succeeded() {
	l.failures = 0
	l.r.failing.Store(0)
	l.r.lastSuccess.Store(time.Now().UnixNano())
	// A reconnect before this success says nothing about a later failure:
	// only one after it may end that failure's backoff.
	l.r.reconnected.Clear()
}

// helper is an extra loop for rounds in flight: woken by a loop whose batch
// came back full, or whose deliveries round found deliveries, it runs rounds of
// the busy lanes alongside, in turn, while they stay busy. It leaves a
// backlog of the deliveries lane to the main loop while fresh events flow
// (owedBatch says why). Waiting for notifications, polling, retries and the
// row-by-row retries are the main loop's.
func (r *Relay) helper(ctx context.Context) {
	failures := 0
	for !r.stopping() && ctx.Err() == nil {
		select {
		case <-r.helpWake:
		case <-r.run.Stopping():
			return
		case <-ctx.Done():
			return
		}
		pending := r.busy.Load()
		for !r.stopping() && ctx.Err() == nil {
			// Read each time: the lane may have found a backlog since, and
			// fresh events may have started or stopped.
			owed := r.owedBusy.Load() && !r.freshFlowing()
			if !pending && !owed {
				break
			}
			var err error
			if pending {
				var claimed []int64
				claimed, err = r.round(ctx, LanePending, r.sql.ClaimBatch, int64(r.config.BatchSize))
				pending = err == nil && len(claimed) == r.config.BatchSize
				r.fresh.claimed(time.Now(), len(claimed))
			}
			if err == nil && owed {
				if r.Hooks.OwedRound != nil {
					r.Hooks.OwedRound(true, r.config.BatchSize)
				}
				_, owed, err = r.owedRound(ctx, r.config.BatchSize)
			}
			if err != nil {
				// The main loop retries row by row, and serves the
				// deliveries lane meanwhile; this one backs off.
				r.owedBusy.Store(false)
				failures++
				if !r.pause(ctx, backoff.Delay(failures, r.config.RetryBackoff, r.config.MaxRetryBackoff), nil) {
					return
				}
				break
			}
			failures = 0
			if pending || owed {
				r.helpWake.Send()
			}
		}
	}
}

// poll reads, at most every PollInterval (and sooner when a failed event is
// due, or this relay has just failed one), whether pending rows wait and when
// the next failed event is due. It returns 0 when rows wait or after running
// due retries, else how long the loop may wait before polling again.
func (r *Relay) poll(ctx context.Context, pollAt *time.Time) (time.Duration, error) {
	if !r.retryCheck.Swap(false) && time.Now().Before(*pollAt) {
		return time.Until(*pollAt), nil
	}
	var (
		waiting bool
		secs    *float64
	)
	if r.Hooks.Polled != nil {
		r.Hooks.Polled()
	}
	// From the claim floor (see claimfloor). The oldest transaction running (xmin) tells whether transaction IDs
	// went back (a failover to a server that was behind): then events wait
	// below the floor, and the next claim starts from 0.
	look := r.claimFloor.Look()
	var (
		xmin        int64
		serverStart time.Time
	)
	// From the owed floors, taking no look: a pair below one (a long
	// transaction's, committed late) waits for a claim's look.
	fromDue, fromSeq := floorArgs(r.owedFloors.Peek(r.known))
	if err := r.pool.QueryRow(ctx, r.sql.Poll, r.known, look.From, look.FromSeq, look.Running, fromDue, fromSeq).Scan(&waiting, &secs, &xmin, &serverStart); err != nil {
		return 0, err
	}
	if r.claimFloor.Check(look, xmin) {
		waiting = true
	}
	if !r.serverStart.IsZero() && !serverStart.Equal(r.serverStart) {
		r.lookBelowSoon() // restarted: a crash may have lost rounds' commits
	}
	r.serverStart = serverStart
	interval := r.config.PollInterval
	*pollAt = time.Now().Add(interval)
	if secs != nil {
		next := time.Duration(*secs * float64(time.Second))
		if next <= 0 {
			return 0, r.retryDue(ctx)
		}
		if next < interval {
			*pollAt = time.Now().Add(next)
		}
	}
	if waiting {
		return 0, nil
	}
	return time.Until(*pollAt), nil
}

// pause sleeps d unless the relay stops first; it reports whether to go on.
// A wake-up on early (nil: none) ends it early too: the main loop's backoff
// after a failed round ends when the listener (re)connects, since the
// database is back.
func (r *Relay) pause(ctx context.Context, d time.Duration, early wake.Signal) bool {
	if r.Hooks.Pause != nil {
		return r.Hooks.Pause(ctx, d) && !r.stopping()
	}
	return r.sleep(ctx, d, early) != sleepStopped
}

// wait blocks until a notification, a stop, or the timer of next; it reports
// whether it was anything but the timer.
func (r *Relay) wait(ctx context.Context, next time.Duration) bool {
	if r.Hooks.Idle != nil {
		r.Hooks.Idle()
	}
	return r.sleep(ctx, max(next, time.Millisecond), r.wake) != sleepTimedOut
}

// sleepEnd is what ended a relay's sleep.
type sleepEnd int

const (
	sleepTimedOut sleepEnd = iota
	sleepWoken             // by the early signal
	sleepStopped           // the run is stopping, or ctx ended
)

// sleep waits d unless early (nil: never) sends or the relay stops first,
// and says which it was.
func (r *Relay) sleep(ctx context.Context, d time.Duration, early wake.Signal) sleepEnd {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return sleepTimedOut
	case <-early:
		return sleepWoken
	case <-r.run.Stopping():
	case <-ctx.Done():
	}
	return sleepStopped
}
