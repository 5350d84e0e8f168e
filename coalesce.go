package events

// Coalescing. A subscriber with [Subscriber.Coalesce] set gets one job per
// subject per round, not one per event: the events of one subject that a
// round claims share a job, which carries the latest of them (the highest
// Seq: rounds take their events in Seq order), and the fanout of every one
// of them names it. Events without a subject, and every event of a
// subscriber without Coalesce, get a job each. A delivery whose Map failed
// in the round neither carries nor is folded into a coalesced job: it is
// retried alone. An ordered subscriber that coalesces also folds a new
// event into its subject's last job while that job still waits its turn
// (see [Subscriber.Ordered]). Folded events are counted by the
// MetricCoalesced counter.
//
// River's unique jobs are not used for this: River requires a unique job's
// ByState to include running, so a change that arrives while the job is
// running would be merged into it and lost.
//
// The planning itself is the delivery engine's (internal/engine's
// coalesce.go).
