package engine

import (
	"encoding/json"
	"testing"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"
)

type testArgs struct{}

func (testArgs) Kind() string { return "test" }

// A job's insert options: the caller's, copied, never modified, with the
// subscriber's tag added after the job's own tags (the options' first, else
// the args'); a job in a chain also gets the ordered tag, and one behind
// its chain's head is inserted pending; the recording request's trace
// context goes into the metadata.
func TestInsertOptsTagsTheSubscriberAndKeepTheCallersOptions(t *testing.T) {
	t.Parallel()
	plain := NewSubscription(Subscription{Name: "mail"})
	ordered := NewSubscription(Subscription{Name: "ledger", Ordered: true})

	t.Run("no options: the subscriber's tag", func(t *testing.T) {
		t.Parallel()
		j := plannedJob{mapped: mapped{sub: plain, args: testArgs{}}}
		opts := j.insertOpts(nil)
		require.Equal(t, []string{"events-subscriber-mail"}, opts.Tags)
		require.False(t, opts.Pending)
		require.Nil(t, opts.Metadata)
	})
	t.Run("the options' tags first, the caller's options untouched", func(t *testing.T) {
		t.Parallel()
		own := &river.InsertOpts{Queue: "q", Priority: 2, Tags: []string{"own"}}
		j := plannedJob{mapped: mapped{sub: plain, args: testArgs{}, opts: own, tags: []string{"args-tag"}}}
		opts := j.insertOpts(nil)
		require.Equal(t, []string{"own", "events-subscriber-mail"}, opts.Tags)
		require.Equal(t, "q", opts.Queue)
		require.Equal(t, 2, opts.Priority)
		require.Equal(t, []string{"own"}, own.Tags, "the caller's options were modified")
		require.NotSame(t, own, opts)
	})
	t.Run("without the options' tags, the args' own", func(t *testing.T) {
		t.Parallel()
		j := plannedJob{mapped: mapped{sub: plain, args: testArgs{}, tags: []string{"args-tag"}}}
		require.Equal(t, []string{"args-tag", "events-subscriber-mail"}, j.insertOpts(nil).Tags)
	})
	t.Run("a chain's head: ordered, released", func(t *testing.T) {
		t.Parallel()
		j := plannedJob{mapped: mapped{sub: ordered, args: testArgs{}}, chain: &chainJob{head: true}}
		opts := j.insertOpts(nil)
		require.Equal(t, []string{"events-subscriber-ledger", TagOrdered}, opts.Tags)
		require.False(t, opts.Pending)
	})
	t.Run("behind the head: pending", func(t *testing.T) {
		t.Parallel()
		j := plannedJob{mapped: mapped{sub: ordered, args: testArgs{}}, chain: &chainJob{late: true}}
		opts := j.insertOpts(nil)
		require.True(t, opts.Pending)
		require.Equal(t, []string{"events-subscriber-ledger", TagOrdered}, opts.Tags)
	})
	t.Run("an ordered subscriber's job outside a chain (no subject) is unordered", func(t *testing.T) {
		t.Parallel()
		j := plannedJob{mapped: mapped{sub: ordered, args: testArgs{}}}
		require.Equal(t, []string{"events-subscriber-ledger"}, j.insertOpts(nil).Tags)
	})
	t.Run("the trace context, twice, beside the host's metadata", func(t *testing.T) {
		t.Parallel()
		j := plannedJob{mapped: mapped{sub: plain, args: testArgs{}, opts: &river.InsertOpts{Metadata: []byte(`{"host":1}`)}}}
		opts := j.insertOpts([]byte(`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`))
		var m map[string]any
		require.NoError(t, json.Unmarshal(opts.Metadata, &m))
		require.Equal(t, map[string]any{
			"host":               float64(1),
			"traceparent":        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
			"events.traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		}, m)
	})
}
