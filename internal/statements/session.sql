-- Settings of the current transaction.

-- name: SetLocal
-- $1 a setting, $2 its value, until the transaction ends (SET LOCAL, with
-- parameters).
SELECT set_config($1, $2, true);
