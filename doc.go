// Package events is a transactional outbox for Go services on PostgreSQL
// that turns every committed event into River jobs, one per matching
// subscriber, exactly once.
//
// # Recording
//
// A service records events inside its own pgx write transaction with
// [Record] (or [RecordMany] for many in one round trip). The event commits or
// vanishes with the write it describes: nothing is visible to a relay before
// commit, and a rollback leaves no trace.
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, "UPDATE notes SET title = $2 WHERE id = $1", id, title); err != nil {
//			return err
//		}
//		_, err := events.Record(ctx, tx, events.Event{Type: "note.changed", Subject: "note:42"})
//		return err
//	})
//
// # Relaying
//
// A [Relay] runs in every process. Each round claims up to [RelayConfig.BatchSize]
// rows that are not yet fanned out, with FOR UPDATE SKIP LOCKED (never a
// sequence cursor, which loses events whose transactions commit out of
// order), inserts one River job per matching [Subscriber] in one call of
// River's insert, and stamps the rows' fanned_out_at and fanout (subscriber
// name to River job ID) in the same transaction. A round of 32 jobs or more,
// none of them unique, is inserted with InsertManyFastTx (a COPY) and its
// IDs read back; a smaller round, or one with a unique job, with
// InsertManyTx. Both run the client's insert hooks and middleware, but a
// COPY returns no rows: an insert middleware sees nil results, as with any
// InsertManyFast (one that fails on them, where InsertManyTx does not,
// makes the relay keep to InsertManyTx for the run, with a warning). A
// client on another driver than River's own pgx driver always gets
// InsertManyTx. Relays need no leader: a row
// claimed by one is skipped by the others. A crash mid-round rolls back the
// jobs and the stamps together, and the rows are claimed again.
//
// Relays wake on the notification [Record] sends, which is throttled (see
// [Outbox.NotifyInterval]: a notifying commit takes a cluster-wide lock), and
// never depend on it: after each wake-up, and each round that found rows, a
// relay re-checks within milliseconds and then less and less often, for
// about a second, and an idle relay polls every [ListenerConfig.PollInterval].
// Watch triggers send no notification (a check per written row cost a tenth
// of a watched table's write throughput): the re-checks and polls find their
// rows.
// [ListenerConfig.PollOnly] and [ListenerConfig.Connect] serve pools behind a
// transaction-pooling proxy such as PgBouncer.
//
// Relays register their subscribers in the database when they start, so
// during a rolling deploy a relay that lacks a new subscriber leaves the
// events it stamps to be caught up by one that has it; see [Relay.Start] and
// [Outbox.RetireSubscriber].
//
// # Subscribers
//
// A subscriber selects events by type with glob patterns ("note.*",
// "supplier.**") and either maps each event to the host's own River job args
// ([Subscriber.Map]) or handles the event in a job worked by the library's
// worker ([Subscriber.Handle], registered by [Relay.AddWorkers], or by
// [Outbox.AddWorkers] in a process without a relay). A subscriber
// may coalesce: one job per subject per batch, for the latest event. A
// subscriber may be ordered ([Subscriber.Ordered]): one subject's jobs run
// one at a time, in the order the relays append them (commit order when the
// subject's producers serialise their writes), subjects in parallel; a
// subject whose head's job River discards is blocked until
// [Outbox.ResumeChain] or [Outbox.SkipChain], or goes on
// ([OrderedContinue]). Map subscribers' workers need [OrderedMiddleware].
// A Handle or HandleTx worker runs on with the jobs waiting behind the one
// River gave it, past River's worker middleware: [JobFromContext] names the
// job a handler runs.
//
// # Awaiting
//
// A writer that must know its event became jobs (a request that answers
// only once the work is queued, a test) waits with an [Awaiter]: one per
// process, over one listening connection, needing no relay in the same
// process. [Awaiter.AwaitFanout] blocks until events are fanned out by any
// relay and returns a [Receipt] each, naming the River job of every
// subscriber; [Awaiter.AwaitDelivery] waits, for one subscriber, until its
// delivery is made too. [RecordedInTx] gives the IDs of the events a
// transaction recorded, also those of watch triggers ([Outbox.InstallWatch]).
//
// # Guarantees
//
// Fan-out happens exactly once per committed event and matching subscriber;
// processing happens at least once (River may run a job again after a
// crash, so handlers must be idempotent). No order is promised between
// events, but for an ordered subscriber's events of one subject: several
// relays work in parallel and River runs jobs concurrently.
//
// # One handle for operators
//
// An [Outbox] names the schema of the library's tables (and River's) and the
// settings its parts share; the zero Outbox is the search_path's. It is said
// once: every component is built from it ([RelayConfig.Outbox],
// [AwaiterConfig.Outbox], the webhook and web view packages' configs), and
// every operation on the tables is one of its methods:
//
//	var outbox events.Outbox // or events.Outbox{Schema: "billing"}, and river.Config{Schema: "billing"}
//	if err := outbox.Migrate(ctx, pool); err != nil { … }
//	relay, err := events.NewRelay(pool, &events.RelayConfig{Outbox: outbox})
//	…
//	st, err := outbox.GetStats(ctx, pool)
//	n, err := outbox.Requeue(ctx, pool, events.PoisonedFilter{EventIDs: []uuid.UUID{eventID}, Subscriber: "search"})
//
// [Record], [RecordMany] and [RecordedInTx] write to the zero Outbox, the
// case of almost every service; [Outbox.Record] and its siblings write to a
// schema of its own. A process that works jobs but runs no relay registers
// its handlers with [Outbox.AddWorkers].
//
// # Failures
//
// The promise is per delivery: one event owed to one matching subscriber,
// and delivery state is kept per delivery. A subscriber whose Map fails for
// an event (an error, a panic, a job River refuses) is retried for that
// delivery alone with backoff and, after [RelayConfig.MaxAttempts] failures,
// the delivery is poisoned: set aside ([Outbox.ListDeliveries],
// [Outbox.Requeue], [Outbox.Discard]) and reported through
// [RelayConfig.OnPoison]; the event's other subscribers get their jobs at
// once. Failures of the database are never counted.
// [Outbox.PauseSubscriber] holds one subscriber's deliveries back while the
// others flow. Refused input is a [*ValidationError] that names the field;
// an event poisoned as a whole makes a receipt a [*PoisonedError].
//
// # Testing
//
// Package eventstest gives tests a throwaway PostgreSQL with the library's
// tables, assertions on what a transaction recorded, and a synchronous
// fan-out ([Relay.FanoutTx]) that needs no goroutine and no LISTEN.
package events
