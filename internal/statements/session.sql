-- Settings of the current transaction.

-- name: SetLocal
-- $1 a setting, $2 its value, until the transaction ends (SET LOCAL, with
-- parameters).
SELECT set_config($1, $2, true);

-- name: BeginRound
-- Begins a relay round's own transaction, with synchronous_commit off, in
-- one round trip: a round lost in a crash vanishes whole and is redone (see
-- Relay.beginRound). Two statements: pgx sends a BeginQuery without
-- parameters, in the simple protocol, in every exec mode.
BEGIN READ WRITE; SET LOCAL synchronous_commit TO off;
