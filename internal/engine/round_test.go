package engine

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"
)

// An event's fanout names each job that carries it, a coalesced job
// included, under its subscriber; a refused job (no result) names nothing.
func TestFanoutByEventNamesEveryJobThatCoversTheEvent(t *testing.T) {
	t.Parallel()
	a, b := &Subscription{Name: "a"}, &Subscription{Name: "b"}
	jobs := []plannedJob{
		{mapped: mapped{sub: a}, event: 2, covers: []int{0, 2}}, // coalesced
		{mapped: mapped{sub: b}, event: 0, covers: []int{0}},
		{mapped: mapped{sub: b}, event: 1, covers: []int{1}}, // refused
		{mapped: mapped{sub: b}, event: 2, covers: []int{2}},
	}
	result := func(id int64) *rivertype.JobInsertResult {
		return &rivertype.JobInsertResult{Job: &rivertype.JobRow{ID: id}}
	}
	got := fanoutByEvent(jobs, []*rivertype.JobInsertResult{result(10), result(11), nil, result(13)}, 3)
	require.Equal(t, [][]fanoutEntry{
		{{"a", 10}, {"b", 11}},
		nil,
		{{"a", 10}, {"b", 13}},
	}, got)
	var doc map[string]int64
	require.NoError(t, json.Unmarshal([]byte(encodeFanout(got[2])), &doc))
	require.Equal(t, map[string]int64{"a": 10, "b": 13}, doc)
	require.Equal(t, "{}", encodeFanout(got[1]))
}

// Receipts' notifications split the IDs under PostgreSQL's 8000-byte
// payload limit, each ID whole, none lost.
func TestNotifyPayloadsStayUnderTheLimit(t *testing.T) {
	t.Parallel()
	require.Empty(t, notifyPayloads(nil))
	ids := make([]uuid.UUID, 2*maxNotifyIDs+1)
	for i := range ids {
		ids[i] = uuid.New()
	}
	payloads := notifyPayloads(ids)
	require.Len(t, payloads, 3)
	var back []string
	for _, p := range payloads {
		require.Less(t, len(p), 8000)
		back = append(back, strings.Split(p, ",")...)
	}
	require.Len(t, back, len(ids))
	for i, id := range ids {
		require.Equal(t, id.String(), back[i])
	}
}
