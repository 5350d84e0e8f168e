-- Retention by whole partitions (issue 31), step 1 of 2: the slot column
-- that outbox_events will be partitioned by (LIST), and the constraint that
-- lets the existing table become the partition of slot -1 without a scan
-- under an exclusive lock. Adding a column with a constant default changes
-- the catalog only; the constraint is added NOT VALID (no scan) and
-- validated by 020, under a lock that lets writers go on.
ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS slot smallint NOT NULL DEFAULT -1;
ALTER TABLE outbox_events ADD CONSTRAINT outbox_events_legacy_slot CHECK (slot = -1) NOT VALID;
