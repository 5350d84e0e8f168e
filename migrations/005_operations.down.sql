ALTER TABLE outbox_events RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
    autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_limit);
DROP INDEX IF EXISTS outbox_events_fanned_idx;
ALTER TABLE outbox_events DROP COLUMN IF EXISTS trace_context;
