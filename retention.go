package events

import (
	"context"
	"time"

	"github.com/standmeet/events/internal/maintenance"
)

// RetentionDefault is how long fanned-out events are kept when
// [RelayConfig.Retention] is zero.
const RetentionDefault = 7 * 24 * time.Hour

// RetentionIntervalDefault is how often a relay runs a retention pass when
// [RelayConfig.RetentionInterval] is zero.
const RetentionIntervalDefault = time.Minute

// pruner runs retention (internal/maintenance's Pruner) every
// RetentionInterval until the relay stops: one relay of the schema at a
// time, batch by batch, a batch a second while the relay drains a backlog.
func (r *Relay) pruner(ctx context.Context) {
	p := &maintenance.Pruner{
		DB:         r.pool,
		SQL:        r.sql,
		Retention:  r.config.Retention,
		Interval:   r.config.RetentionInterval,
		Busy:       func() bool { return r.busy.Load() || r.owedBusy.Load() },
		Logger:     r.logger,
		OnPass:     r.hooks.prunePass,
		OnBatch:    r.hooks.pruning,
		OnTruncate: r.hooks.truncated,
	}
	p.Run(ctx, r.run.Stopping())
}
