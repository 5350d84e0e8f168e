package events

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Coalescing as subscribers see it, end to end; the planning's own cases
// are internal/engine's TestCoalesce.

func TestEverySubjectEventReachesANonCoalescingSubscriber(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, mapSub("webhooks", false, "supplier.**"))
	es := b.record(t,
		Event{Type: "supplier.connected", Subject: "supplier:7"},
		Event{Type: "supplier.activated", Subject: "supplier:7"},
		Event{Type: "supplier.connected", Subject: "supplier:8"},
	)
	b.start(t)
	waitFannedOut(t, b.pool, 10*time.Second)
	rows := loadRows(t, b.pool)
	jobs := loadJobs(t, b.pool)
	require.Len(t, jobs, 3)
	seen := map[int64]bool{}
	for _, e := range es {
		id := rows[e.ID].Fanout["webhooks"]
		require.Equal(t, e.ID, jobs[id].EventID, "%s got another event's job", e.Type)
		require.False(t, seen[id])
		seen[id] = true
	}
}

func TestCoalescingSubscriberGetsOneJobPerSubjectForTheLatestEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}, mapSub("search", true, "supplier.**"), mapSub("webhooks", false, "supplier.**"))
	es := b.record(t,
		Event{Type: "supplier.connected", Subject: "supplier:7"},
		Event{Type: "supplier.renamed", Subject: "supplier:8"},
		Event{Type: "supplier.activated", Subject: "supplier:7"},
		Event{Type: "supplier.renamed", Subject: "supplier:7"},
		Event{Type: "supplier.pinged"}, // no subject: never coalesced
		Event{Type: "supplier.pinged"},
	)
	b.start(t)
	waitFannedOut(t, b.pool, 10*time.Second)
	rows := loadRows(t, b.pool)
	jobs := loadJobs(t, b.pool)

	search := map[int64]bool{}
	for _, j := range jobs {
		if j.Subscriber == "search" {
			search[j.ID] = true
		}
	}
	require.Len(t, search, 4, "supplier:7, supplier:8, and one per subject-less event")
	latest7 := es[3]
	for _, e := range es[:4] {
		id := rows[e.ID].Fanout["search"]
		if e.Subject == "supplier:7" {
			require.Equal(t, latest7.ID, jobs[id].EventID, "earlier events of a subject name the latest event's job")
		} else {
			require.Equal(t, e.ID, jobs[id].EventID)
		}
	}
	require.NotEqual(t, rows[es[4].ID].Fanout["search"], rows[es[5].ID].Fanout["search"])
	// The non-coalescing subscriber beside it still gets every event.
	webhooks := 0
	for _, j := range jobs {
		if j.Subscriber == "webhooks" {
			webhooks++
		}
	}
	require.Equal(t, len(es), webhooks)
}
