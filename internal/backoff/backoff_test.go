package backoff

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDelay(t *testing.T) {
	t.Parallel()
	var got []time.Duration
	for attempt := 1; attempt <= 8; attempt++ {
		got = append(got, Delay(attempt, 2*time.Second, time.Minute))
	}
	require.Equal(t, []time.Duration{
		2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
		32 * time.Second, time.Minute, time.Minute, time.Minute,
	}, got)
	require.Equal(t, time.Minute, Delay(1000, 2*time.Second, time.Minute), "no overflow")
	require.Equal(t, 2*time.Second, Delay(0, 2*time.Second, time.Minute))
}
