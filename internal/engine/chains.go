package engine

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/standmeet/events/internal/dbutil"
	"github.com/standmeet/events/internal/statements"
)

// TagOrdered marks the jobs of ordered subscribers: the library's worker
// and OrderedMiddleware complete them in their chain, whichever release
// inserted them.
const TagOrdered = "events-ordered"

// Timings of ordered subscribers.
const (
	// orderedWait is how long a round waits for an earlier event of a chain
	// that another round is fanning out, before deferring its own.
	orderedWait = 250 * time.Millisecond
	// deferBase and deferMax: a deferred pair is retried after deferBase,
	// doubling with each deferral, at most deferMax. A deferral is not a
	// failed attempt.
	deferBase = 20 * time.Millisecond
	deferMax  = 30 * time.Second
)

// chainJob is a planned job's place in its chain.
type chainJob struct {
	// late: the chain was not locked by the round's prepare (its subscriber
	// does not coalesce); the job is inserted pending and appended, and
	// released if it heads the chain, by the stamp (ChainAppendLate). pos,
	// head and replaces are then unused.
	late bool
	pos  int64
	// head: the chain was empty, so the job is its head and is inserted
	// available; every other job of a chain is inserted pending.
	head bool
	// replaces is the pending tail job that this job of a coalescing
	// subscriber replaces (given the newer event) instead of being
	// inserted; 0 for none.
	replaces int64
}

func (c *chainJob) replacing() bool { return c != nil && c.replaces != 0 }

// chainKey names a chain within a round.
type chainKey struct {
	sub     *Subscription
	subject string
}

// pairKey is an (event seq, subscriber) pair.
type pairKey struct {
	seq int64
	sub string
}

// chainPlan is what a round does with the jobs of ordered subscribers: the
// chains it appends to, and the pairs it defers.
type chainPlan struct {
	sql      *statements.Ordered
	schema   string
	deferred map[pairKey]bool
	defSeqs  []int64
	defSubs  []string
	// defDue is when each deferred pair is due: its blocker's next
	// attempt, or nil (after the deferral backoff).
	defDue []*time.Time
}

// isDeferred reports whether the round defers the pair (seq, sub).
func (cp *chainPlan) isDeferred(seq int64, sub string) bool {
	return cp != nil && cp.deferred[pairKey{seq, sub}]
}

// orderChains places a round's jobs of ordered subscribers in their chains
// (outbox_chain_prepare): it takes out of p the jobs that must wait for an
// earlier event of their subject (still owed elsewhere, or failed in this
// round), whose pairs are deferred, and marks the others as late: inserted
// pending, appended by the stamp, which locks their chains only then
// (ChainAppendLate). A coalescing subscriber's chains are locked here: each
// of its jobs is marked as the head or pending, and one whose chain has a
// pending tail replaces that tail. Without ordered jobs it does nothing and
// costs nothing.
func (r *Relay) orderChains(ctx context.Context, tx pgx.Tx, l Lane, batch []claimedRow, p *roundPlan) (*chainPlan, error) {
	var (
		keys  []chainKey
		byKey = map[chainKey][]int{}
	)
	for i, j := range p.jobs {
		if !j.sub.Ordered || batch[j.event].Subject == "" {
			continue
		}
		k := chainKey{j.sub, batch[j.event].Subject}
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], i)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	sql := &r.sql.Ordered
	// A pair of this round whose mapping failed stays owed: it is an earlier
	// event for the jobs of its chain that come after it.
	failedAt := map[chainKey]int64{}
	for _, f := range p.failed {
		if !f.sub.Ordered || f.row.Subject == "" {
			continue
		}
		k := chainKey{f.sub, f.row.Subject}
		if cur, ok := failedAt[k]; !ok || f.row.Seq < cur {
			failedAt[k] = f.row.Seq
		}
	}
	var (
		subs, subjects, res []string
		minSeqs, maxSeqs    []int64
		counts              []int64
		blocks, locks       []bool
		// Never nil: pgx sends a nil slice as NULL, and "seq <> ALL(NULL)"
		// is NULL, not true.
		claimed, pairSeqs = []int64{}, []int64{}
		pairSubs          = []string{}
		index             = map[[2]string]chainKey{}
		carried           = func(i int) int64 { return batch[p.jobs[i].event].Seq }
		toRemove          = map[int]bool{}
	)
	for _, k := range keys {
		idx := byKey[k]
		slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(carried(a), carried(b)) })
		re := k.sub.TypesRE
		subs = append(subs, k.sub.Name)
		subjects = append(subjects, k.subject)
		minSeqs = append(minSeqs, carried(idx[0]))
		maxSeqs = append(maxSeqs, carried(idx[len(idx)-1]))
		res = append(res, re)
		blocks = append(blocks, !k.sub.Continue)
		locks = append(locks, k.sub.Coalesce)
		counts = append(counts, int64(len(idx)))
		index[[2]string{k.sub.Name, k.subject}] = k
	}
	for _, c := range batch {
		if l == LanePending {
			claimed = append(claimed, c.Seq)
			continue
		}
		for _, o := range c.owed {
			pairSeqs, pairSubs = append(pairSeqs, c.Seq), append(pairSubs, o.sub)
		}
	}
	rows, err := tx.Query(ctx, sql.ChainPrepare, subs, subjects, minSeqs, maxSeqs, res, blocks, counts, claimed, pairSeqs, pairSubs,
		int32(orderedWait.Milliseconds()), locks)
	if err != nil {
		return nil, fmt.Errorf("preparing chains: %w", err)
	}
	cp := &chainPlan{sql: sql, schema: r.sql.Schema, deferred: map[pairKey]bool{}}
	seen := 0
	for rows.Next() {
		var (
			name, subject string
			head, tail    *int64
			nextPos       int64
			blocked       bool
			blocker       *int64
			due           *time.Time
			tailKind      *string
			tailSeq       *int64
		)
		if err := rows.Scan(&name, &subject, &head, &tail, &nextPos, &blocked, &blocker, &due, &tailKind, &tailSeq); err != nil {
			rows.Close()
			return nil, fmt.Errorf("preparing chains: %w", err)
		}
		k, ok := index[[2]string{name, subject}]
		if !ok {
			continue
		}
		seen++
		if f, ok := failedAt[k]; ok && (blocker == nil || f < *blocker) {
			blocker, due = &f, nil // its retry is charged in this round: due after the deferral backoff
		}
		idx := byKey[k]
		// The jobs up to the first one that comes after the blocker are
		// appended, in seq order; that one and every later one wait.
		cut := len(idx)
		for n, i := range idx {
			if blocker != nil && *blocker < carried(i) {
				cut = n
				break
			}
		}
		pos := nextPos - int64(len(idx))
		for n, i := range idx[:cut] {
			if !k.sub.Coalesce {
				p.jobs[i].chain = &chainJob{late: true}
				continue
			}
			pos++
			cj := &chainJob{pos: pos, head: n == 0 && head == nil}
			// A coalescing subscriber's job takes the pending tail's place
			// only with a later event: never an older one in place of a
			// newer (one whose transaction committed late is appended).
			if n == 0 && head != nil && k.sub.Coalesce && tail != nil && tailKind != nil && *tailKind == p.jobs[i].kind &&
				tailSeq != nil && *tailSeq < carried(i) {
				cj.replaces = *tail
			}
			p.jobs[i].chain = cj
		}
		for _, i := range idx[cut:] {
			toRemove[i] = true
			for _, ev := range p.jobs[i].covers {
				pk := pairKey{batch[ev].Seq, k.sub.Name}
				if !cp.deferred[pk] {
					cp.deferred[pk] = true
					cp.defSeqs, cp.defSubs, cp.defDue = append(cp.defSeqs, pk.seq), append(cp.defSubs, pk.sub), append(cp.defDue, due)
				}
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("preparing chains: %w", err)
	}
	if seen != len(keys) {
		return nil, fmt.Errorf("preparing chains: %d of %d chains came back", seen, len(keys))
	}
	if len(toRemove) > 0 {
		kept := p.jobs[:0]
		for i, j := range p.jobs {
			if !toRemove[i] {
				kept = append(kept, j)
			}
		}
		p.jobs = kept
	}
	return cp, nil
}

// replaced returns the round's insert results with those of the jobs that
// replace a pending tail filled in (they are not inserted: the tail is the
// job their events' fanout names).
func (cp *chainPlan) replaced(jobs []plannedJob) []*rivertype.JobInsertResult {
	results := make([]*rivertype.JobInsertResult, len(jobs))
	if cp == nil {
		return results
	}
	for i, j := range jobs {
		if j.chain.replacing() {
			results[i] = &rivertype.JobInsertResult{Job: &rivertype.JobRow{ID: j.chain.replaces, Kind: j.kind}}
		}
	}
	return results
}

// queue queues, in b (the round's stamp), the appends — links, heads and
// tails, replaced tails' args — of the jobs inserted, and the deferrals.
func (cp *chainPlan) queue(b *pgx.Batch, batch []claimedRow, jobs []plannedJob, results []*rivertype.JobInsertResult) error {
	if cp == nil {
		return nil
	}
	var (
		lSubs, lSubjects, lTypes, lIDs []string
		lPos, lJobs, lSeqs             []int64
		cSubs, cSubjects               []string
		cFirst, cLast                  []int64
		rIDs                           []int64
		rArgs                          []string
		chainAt                        = map[[2]string]int{}
	)
	var (
		aSubs, aSubjects, aTypes, aIDs []string
		aJobs, aSeqs                   []int64
		late                           = map[[2]string]int{}
		nSubs, nSubjects               []string
		nCounts, nFirst, nLast         []int64
		firstSeq, lastSeq              []int64
	)
	for i, j := range jobs {
		if j.chain == nil || results[i] == nil {
			continue
		}
		e := batch[j.event]
		id := results[i].Job.ID
		if j.chain.late {
			// In seq order within a chain: jobs are planned in the batch's
			// order, and the SQL numbers them by seq.
			aSubs, aSubjects, aJobs, aSeqs = append(aSubs, j.sub.Name), append(aSubjects, e.Subject), append(aJobs, id), append(aSeqs, e.Seq)
			aIDs, aTypes = append(aIDs, e.ID.String()), append(aTypes, e.Type)
			key := [2]string{j.sub.Name, e.Subject}
			at, ok := late[key]
			if !ok {
				at = len(nSubs)
				late[key] = at
				nSubs, nSubjects, nCounts = append(nSubs, j.sub.Name), append(nSubjects, e.Subject), append(nCounts, 0)
				nFirst, nLast, firstSeq, lastSeq = append(nFirst, id), append(nLast, id), append(firstSeq, e.Seq), append(lastSeq, e.Seq)
			}
			nCounts[at]++
			if e.Seq < firstSeq[at] {
				nFirst[at], firstSeq[at] = id, e.Seq
			}
			if e.Seq > lastSeq[at] {
				nLast[at], lastSeq[at] = id, e.Seq
			}
			continue
		}
		lSubs, lSubjects, lPos, lJobs = append(lSubs, j.sub.Name), append(lSubjects, e.Subject), append(lPos, j.chain.pos), append(lJobs, id)
		lSeqs, lIDs, lTypes = append(lSeqs, e.Seq), append(lIDs, e.ID.String()), append(lTypes, e.Type)
		key := [2]string{j.sub.Name, e.Subject}
		if at, ok := chainAt[key]; ok {
			cLast[at] = id
		} else {
			chainAt[key] = len(cSubs)
			cSubs, cSubjects, cFirst, cLast = append(cSubs, j.sub.Name), append(cSubjects, e.Subject), append(cFirst, id), append(cLast, id)
		}
		if j.chain.replacing() {
			args, err := marshalArgs(j.args)
			if err != nil {
				return fmt.Errorf("encoding the args that replace job %d: %w", id, err)
			}
			rIDs, rArgs = append(rIDs, id), append(rArgs, string(args))
		}
	}
	if len(lJobs) > 0 {
		b.Queue(cp.sql.ChainAppend, lSubs, lSubjects, lPos, lJobs, lSeqs, lIDs, lTypes, cSubs, cSubjects, cFirst, cLast, rIDs, rArgs)
	}
	if len(aJobs) > 0 {
		b.Queue(cp.sql.ChainAppendLate, nSubs, nSubjects, nCounts, nFirst, nLast, aSubs, aSubjects, aJobs, aSeqs, aIDs, aTypes, dbutil.NilIfEmpty(cp.schema))
	}
	if len(cp.defSeqs) > 0 {
		b.Queue(cp.sql.ChainDefer, cp.defSeqs, cp.defSubs, deferBase.Microseconds(), deferMax.Microseconds(), cp.defDue)
	}
	return nil
}

// marshalArgs is json.Marshal of a job's args, whose MarshalJSON is host
// code: a panic in it is an error.
func marshalArgs(args river.JobArgs) (b []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			b, err = nil, PanicError("the job args' MarshalJSON", p)
		}
	}()
	return json.Marshal(args)
}
