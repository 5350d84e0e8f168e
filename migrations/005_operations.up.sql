-- W3C trace context of the request that recorded the event
-- ({"traceparent": …, "tracestate": …}), copied into the metadata of its
-- jobs. NULL when the recording context had no span: such events cost
-- nothing more.
ALTER TABLE outbox_events ADD COLUMN trace_context jsonb;

-- Fanned-out rows by fan-out time: what retention deletes, oldest first, and
-- what Stats counts as fanned out in the last minute.
CREATE INDEX outbox_events_fanned_idx ON outbox_events (fanned_out_at)
    WHERE fanned_out_at IS NOT NULL AND poisoned_at IS NULL;

-- The stamp UPDATE changes indexed columns, so it is never a HOT update:
-- every fan-out leaves a dead row version, and retention deletes many rows.
-- Vacuum this table more eagerly than the defaults (which wait for 20% of
-- the table to be dead).
ALTER TABLE outbox_events SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.05,
    autovacuum_vacuum_cost_limit = 2000
);
