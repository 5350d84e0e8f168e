package events

import (
	"time"
)

// RetentionDefault is how long fanned-out events are kept when
// [RelayConfig.Retention] is zero.
const RetentionDefault = 7 * 24 * time.Hour

// RetentionIntervalDefault is how often a relay runs a retention pass when
// [RelayConfig.RetentionInterval] is zero.
const RetentionIntervalDefault = time.Minute
