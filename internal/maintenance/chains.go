package maintenance

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/standmeet/events/internal/dbutil"
	"github.com/standmeet/events/internal/startstop"
	"github.com/standmeet/events/internal/statements"
)

const (
	// ChainSweepInterval bounds how long a chain whose head River discarded
	// or cancelled takes to be blocked (or moved on), and a head completed
	// without the library's completion to be released.
	ChainSweepInterval = time.Second
	// ChainSweepBatch is how many chains of one subscriber one sweep
	// statement handles.
	ChainSweepBatch = 1000
	// chainSweepLockClass is the advisory lock class of the sweep: one
	// relay at a time sweeps a subscriber's chains.
	chainSweepLockClass = 7365110
	// chainRepairEvery is how many sweeps apart the repair runs (Repair):
	// its statement reads every link and every pending ordered job.
	chainRepairEvery = 10
	// DeadWorkerAfter is how long a River client's relay must have been
	// silent (never marked stopped) before the heads of chains its process
	// was running are given back to River: six heartbeats.
	DeadWorkerAfter = 6 * HeartbeatInterval
)

// ChainSweeper looks after ordered subscribers' chains (see
// outbox_chain_sweep): River tells no one when it discards a job after its
// last attempt, a process may die while its worker runs a chain's head, and
// a release may stop ordering a subscriber, or retire it. Every sweep it
//
//   - repairs what a release before migration 015 may leave, every tenth
//     sweep (Repair);
//   - releases the chains of the subscribers this release serves unordered
//     and of retired ones (Release);
//   - gives back to River the heads that a dead process's worker held
//     (Rescue), and blocks, moves on or releases the chains whose heads
//     ended without moving them (Sweep).
type ChainSweeper struct {
	DB  *pgxpool.Pool
	SQL *statements.Set
	// Ordered are the run's ordered subscribers, Continue those of them
	// that go on past a discarded head; Unordered the others.
	Ordered, Continue, Unordered []string
	// Tag marks ordered subscribers' jobs.
	Tag string
	// DeadWorkerAfter overrides DeadWorkerAfter (tests).
	DeadWorkerAfter time.Duration
	Logger          *slog.Logger
	// OnRescued runs after every rescue (tests).
	OnRescued func()
	// Stopping closes when the relay stops: a sweep ends between
	// statements.
	Stopping <-chan struct{}
}

// Run sweeps at once and then every ChainSweepInterval until Stopping
// closes or ctx ends. Without subscribers there is nothing to sweep.
func (s *ChainSweeper) Run(ctx context.Context) {
	if len(s.Ordered) == 0 && len(s.Unordered) == 0 {
		return
	}
	sweeps := 0
	startstop.Every(ctx, s.Stopping, 0, ChainSweepInterval, func() {
		if sweeps%chainRepairEvery == 0 {
			s.warn(ctx, s.Repair(ctx), "events: repairing ordered chains failed")
		}
		sweeps++
		if len(s.Unordered) > 0 {
			s.warn(ctx, s.Release(ctx, s.Unordered, "events: released the waiting jobs of subscribers that this release does not order (Ordered was turned off)"),
				"events: releasing the chains of unordered subscribers failed")
		}
		s.warn(ctx, s.ReleaseRetired(ctx), "events: releasing the chains of retired subscribers failed")
		if len(s.Ordered) == 0 {
			return
		}
		s.warn(ctx, s.Rescue(ctx), "events: rescuing the heads of dead workers failed")
		if s.OnRescued != nil {
			s.OnRescued()
		}
		s.warn(ctx, s.Sweep(ctx), "events: sweeping ordered chains failed")
	})
}

// warn logs err, unless it is nil or the relay stops.
func (s *ChainSweeper) warn(ctx context.Context, err error, msg string) {
	if err != nil && !stopped(ctx, s.Stopping) {
		s.Logger.WarnContext(ctx, msg, slog.String("err", err.Error()))
	}
}

// Rescue gives back to River the heads of the chains of the ordered
// subscribers whose worker's process died (ChainRescue): its subject moves
// again within DeadWorkerAfter and a sweep, not River's rescue
// (RescueStuckJobsAfter, an hour by default, for every job). A hung but
// live worker's process still heartbeats: its job is River's to rescue.
func (s *ChainSweeper) Rescue(ctx context.Context) error {
	after := cmp.Or(s.DeadWorkerAfter, DeadWorkerAfter)
	rows, err := s.DB.Query(ctx, s.SQL.Ordered.ChainRescue, s.Ordered, after.Microseconds(), dbutil.NilIfEmpty(s.SQL.Schema))
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id            int64
			state, client string
		)
		if err := rows.Scan(&id, &state, &client, nil); err != nil {
			return err
		}
		s.Logger.WarnContext(ctx, "events: an ordered job's worker died (its process stopped heartbeating): gave the job back to River",
			slog.Int64("job_id", id), slog.String("river_client", client), slog.String("state", state))
	}
	return rows.Err()
}

// Repair releases the jobs that would otherwise be held for good
// (ChainRepair): links whose chain is gone and ordered jobs pending in no
// chain (a release before migration 015 may leave them), which run as any
// job of their subscriber, and chains' heads left pending, which run in
// their turn.
func (s *ChainSweeper) Repair(ctx context.Context) error {
	released := int64(0)
	for !stopped(ctx, s.Stopping) {
		var n int64
		if err := s.DB.QueryRow(ctx, s.SQL.Ordered.ChainRepair, ChainSweepBatch, dbutil.NilIfEmpty(s.SQL.Schema), s.Tag).Scan(&n, nil); err != nil {
			return err
		}
		released += n
		if n < ChainSweepBatch {
			break
		}
	}
	if released > 0 {
		s.Logger.WarnContext(ctx, "events: released ordered jobs held for good: in no chain (left by a release before migration 015), or a chain's head left pending",
			slog.Int64("jobs", released))
	}
	return nil
}

// ReleaseRetired releases the chains of retired subscribers, which no relay
// orders any more: retiring is final, and a retired subscriber's chain
// would otherwise hold its waiting jobs for good behind a head that its
// worker cancelled (a Handle job of a retired subscriber ends cancelled; a
// Map job runs as any job of its kind).
func (s *ChainSweeper) ReleaseRetired(ctx context.Context) error {
	var retired []string
	if err := s.DB.QueryRow(ctx, s.SQL.Ordered.ChainRetired).Scan(&retired); err != nil {
		return err
	}
	if len(retired) == 0 {
		return nil
	}
	return s.Release(ctx, retired, "events: released the chains of retired subscribers")
}

// Release releases the chains of subscribers subs, and logs done if it
// released any: subscribers this run serves unordered (a release with
// Ordered set left them; Ordered was turned off since), or retired ones.
// Their waiting jobs are made available and run as any job of the
// subscriber; a job that the ordered release tagged completes as an
// unordered one (its chain is gone). Without this its jobs would wait
// behind their heads for good.
func (s *ChainSweeper) Release(ctx context.Context, subs []string, done string) error {
	released := int64(0)
	for !stopped(ctx, s.Stopping) {
		// The links go and the chains left empty with them, in one
		// transaction; an empty chain is dropped only under its lock and
		// after a fresh look (ChainLockEmpty, then ChainDropEmpty). The
		// BEGIN, the release and the lock go in one round trip, the commit
		// in another: a sweep that finds nothing costs two.
		n, err := s.releaseOnce(ctx, subs)
		if err != nil {
			return err
		}
		released += n
		if n < ChainSweepBatch {
			break
		}
	}
	if released > 0 {
		s.Logger.WarnContext(ctx, done, slog.Any("subscribers", subs), slog.Int64("jobs", released))
	}
	return nil
}

// releaseOnce releases up to ChainSweepBatch links of the chains of subs
// and drops the chains left empty, and reports how many links went.
func (s *ChainSweeper) releaseOnce(ctx context.Context, subs []string) (n int64, err error) {
	c, err := s.DB.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer c.Release() // a connection left in a transaction is closed, not pooled
	var (
		b                     pgx.Batch
		subscribers, subjects []string
	)
	b.BeginTx(ownTx)
	b.Queue(s.SQL.Ordered.ChainRelease, subs, ChainSweepBatch, dbutil.NilIfEmpty(s.SQL.Schema)).QueryRow(func(row pgx.Row) error {
		return row.Scan(&n, nil)
	})
	b.Queue(s.SQL.Ordered.ChainLockEmpty, subs).Query(func(rows pgx.Rows) error {
		var sub, subject string
		_, err := pgx.ForEachRow(rows, []any{&sub, &subject}, func() error {
			subscribers, subjects = append(subscribers, sub), append(subjects, subject)
			return nil
		})
		return err
	})
	tx, err := dbutil.SendBegun(ctx, c, &b)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if len(subscribers) > 0 {
		if _, err := tx.Exec(ctx, s.SQL.Ordered.ChainDropEmpty, subscribers, subjects); err != nil {
			return 0, err
		}
	}
	return n, tx.Commit(ctx)
}

// Sweep runs one sweep of the ordered subscribers' chains, statement after
// statement while they come back full.
func (s *ChainSweeper) Sweep(ctx context.Context) error {
	for !stopped(ctx, s.Stopping) {
		n := 0
		err := pgx.BeginTxFunc(ctx, s.DB, ownTx, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, s.SQL.Ordered.ChainSweep, s.Ordered, s.Continue, ChainSweepBatch, dbutil.NilIfEmpty(s.SQL.Schema), chainSweepLockClass)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var (
					sub, subject, action, state string
					jobID                       int64
				)
				if err := rows.Scan(&sub, &subject, &jobID, &action, &state); err != nil {
					return err
				}
				n++
				s.logAction(ctx, sub, subject, jobID, action, state)
			}
			return rows.Err()
		})
		if err != nil {
			return err
		}
		if n < ChainSweepBatch {
			return nil
		}
	}
	return nil
}

func (s *ChainSweeper) logAction(ctx context.Context, sub, subject string, jobID int64, action, state string) {
	attrs := []slog.Attr{slog.String("subscriber", sub), slog.String("subject", subject), slog.Int64("job_id", jobID), slog.String("state", state)}
	switch action {
	case "blocked":
		s.Logger.LogAttrs(ctx, slog.LevelError, "events: an ordered subscriber's subject is blocked: the job at its head ended "+state+
			"; resume or skip it (Outbox.ResumeChain, Outbox.SkipChain, `events chains`)", attrs...)
	case "skipped":
		s.Logger.LogAttrs(ctx, slog.LevelWarn, "events: an ordered subscriber's job ended "+state+"; its subject goes on with the next (OrderedContinue)", attrs...)
	case "released":
		s.Logger.LogAttrs(ctx, slog.LevelWarn, "events: an ordered job completed without moving its chain on; released the next now"+
			" (is events.OrderedMiddleware in river.Config.Middleware of every client that works this subscriber's jobs?)", attrs...)
	}
}
