package engine

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// coalesce needs no database: it is a pure function of the batch and what
// each event mapped to. Each case names the branch it pins; the jobs are
// compared whole (subscriber, the event carried, the mapping carried, the
// events covered) and in order, so changing a branch fails a case.
func TestCoalesce(t *testing.T) {
	t.Parallel()
	plain := &Subscription{Name: "plain"}
	merge := &Subscription{Name: "merge", Coalesce: true}
	other := &Subscription{Name: "other", Coalesce: true}

	// job is a planned job as the cases state it: carried is the kind of
	// the mapping the job carries, labelled "<subscriber>@<event index>".
	type job struct {
		sub     string
		event   int
		carried string
		covers  []int
	}
	// ev is one event of a batch: its subject, and the subscribers it
	// mapped to (none: every mapping failed).
	type ev struct {
		subject string
		subs    []*Subscription
	}
	for _, tt := range []struct {
		name   string
		events []ev
		want   []job
	}{{
		name: "empty batch: no jobs",
	}, {
		name:   "a subscriber without Coalesce gets a job per event, even for one subject",
		events: []ev{{"s", []*Subscription{plain}}, {"s", []*Subscription{plain}}},
		want:   []job{{"plain", 0, "plain@0", []int{0}}, {"plain", 1, "plain@1", []int{1}}},
	}, {
		name:   "events without a subject are never coalesced",
		events: []ev{{"", []*Subscription{merge}}, {"", []*Subscription{merge}}},
		want:   []job{{"merge", 0, "merge@0", []int{0}}, {"merge", 1, "merge@1", []int{1}}},
	}, {
		name:   "one subject shares one job, which carries the latest event and covers them all, in the first one's place",
		events: []ev{{"s", []*Subscription{merge}}, {"t", []*Subscription{merge}}, {"s", []*Subscription{merge}}, {"s", []*Subscription{merge}}},
		want:   []job{{"merge", 3, "merge@3", []int{0, 2, 3}}, {"merge", 1, "merge@1", []int{1}}},
	}, {
		name:   "subjects are per subscriber: two coalescing subscribers of one subject get a job each",
		events: []ev{{"s", []*Subscription{merge, other}}, {"s", []*Subscription{merge, other}}},
		want:   []job{{"merge", 1, "merge@1", []int{0, 1}}, {"other", 1, "other@1", []int{0, 1}}},
	}, {
		name:   "coalescing and plain subscribers of the same events keep to their own rules",
		events: []ev{{"s", []*Subscription{plain, merge}}, {"s", []*Subscription{plain, merge}}},
		want:   []job{{"plain", 0, "plain@0", []int{0}}, {"merge", 1, "merge@1", []int{0, 1}}, {"plain", 1, "plain@1", []int{1}}},
	}, {
		name:   "an event whose mapping failed gets no job and is covered by none",
		events: []ev{{"s", []*Subscription{merge}}, {"s", nil}, {"s", []*Subscription{merge}}},
		want:   []job{{"merge", 2, "merge@2", []int{0, 2}}},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var (
				batch    []claimedRow
				perEvent [][]mapped
			)
			for i, e := range tt.events {
				batch = append(batch, claimedRow{Event: Event{Subject: e.subject}})
				var ms []mapped
				for _, s := range e.subs {
					ms = append(ms, mapped{sub: s, kind: fmt.Sprintf("%s@%d", s.Name, i)})
				}
				perEvent = append(perEvent, ms)
			}
			var got []job
			for _, j := range coalesce(batch, perEvent) {
				got = append(got, job{j.sub.Name, j.event, j.kind, j.covers})
			}
			require.Equal(t, tt.want, got)
		})
	}
}
