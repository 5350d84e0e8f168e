-- events: outside a transaction
-- The claim floor's index (see 016): ClaimFrom starts its scan at the floor.
-- Built with CREATE INDEX CONCURRENTLY, outside any transaction, so that
-- writers never wait for the build, however large the table: Migrate runs
-- this one statement on its own connection, then checks that the index is
-- valid (a build cut short leaves an invalid one, which it drops and builds
-- again; one that another process is building, it waits for).
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_claim_floor_idx ON /* schema */outbox_events (xact_id, seq)
    WHERE fanned_out_at IS NULL AND poisoned_at IS NULL AND attempts = 0
