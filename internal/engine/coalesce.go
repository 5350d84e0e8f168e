package engine

// coalesce turns each event's mapped jobs into the round's jobs. For a
// subscriber with Coalesce set, the events of one subject in the batch share
// one job, which carries the latest of them (batches are in seq order), and
// the fanout of every one of them names it. Events without a subject, and
// every event of a subscriber without Coalesce, get a job each. Deliveries whose
// mapping failed are not in perEvent: they get none.
//
// River's unique jobs are not used for this: River requires a unique job's
// ByState to include running, so a change that arrives while the job is
// running would be merged into it and lost.
func coalesce(batch []claimedRow, perEvent [][]mapped) []plannedJob {
	var jobs []plannedJob
	// For coalescing subscribers: (subscriber, subject) -> index in jobs.
	type key struct {
		sub     *Subscription
		subject string
	}
	latest := map[key]int{}
	for i, ms := range perEvent {
		for _, m := range ms {
			if !m.sub.Coalesce || batch[i].Subject == "" {
				jobs = append(jobs, plannedJob{mapped: m, event: i, covers: []int{i}})
				continue
			}
			k := key{m.sub, batch[i].Subject}
			if j, ok := latest[k]; ok {
				// Batches are in seq order: this event is the later one.
				job := &jobs[j]
				job.mapped, job.event = m, i
				job.covers = append(job.covers, i)
				continue
			}
			latest[k] = len(jobs)
			jobs = append(jobs, plannedJob{mapped: m, event: i, covers: []int{i}})
		}
	}
	return jobs
}
