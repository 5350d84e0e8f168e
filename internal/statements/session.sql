-- Settings of the current transaction.

-- name: SetLocal
-- $1 a setting, $2 its value, until the transaction ends (SET LOCAL, with
-- parameters).
SELECT set_config($1, $2, true);

-- name: RoundSettings
-- A relay round's own transaction, queued after its BEGIN, with the claim,
-- in the round's first round trip:
--  - it commits without waiting for its flush: a round lost in a crash
--    vanishes whole and is redone (see Relay.roundTx);
--  - its job inserts flush the pending lists of River's GIN indexes on
--    river_job (args, metadata) once they pass 128 kB, not 4 MB (the
--    default): every insert that finds a list over its limit merges it into
--    the index, and a 4 MB merge stalled a round for 80–180 ms (commit to
--    fanned out at 2,000/s p99: 106–147 ms with the default, 15–18 ms with
--    this). The relay, not a host's transaction, then takes the merges.
--  - it reads the transactions still running (its statement's snapshot,
--    taken before the claim's): every other transaction below the
--    snapshot's xmax had ended before the claim looked, so the claim saw
--    all their rows (see package claimfloor).
SELECT set_config('synchronous_commit', 'off', true), set_config('gin_pending_list_limit', '128', true),
       pg_current_snapshot()::text;

-- name: Commit
-- Ends a relay round's own transaction, queued after its stamp: the stamp
-- and the commit share one round trip.
COMMIT;

-- name: Setting
-- $1 a setting: its current value.
SELECT current_setting($1);
