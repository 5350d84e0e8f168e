-- Webhooks (package webhook), after 0.1.0: re-enabling an endpoint
-- invalidates the deliveries that were pending when it was disabled.

-- When the endpoint was last enabled again after a disable; NULL if never.
-- A delivery created before it was pending at disable time and is cancelled.
ALTER TABLE webhook_endpoints ADD COLUMN enabled_at timestamptz;

-- Secrets sealed at rest. secrets holds [{"key_id", "sealed", "expires_at"}]:
-- "sealed" is the base64 of an AES-256-GCM nonce and ciphertext under the
-- host's key "key_id" (rows from 003, and hosts that opted in to plain
-- storage, hold {"secret": "whsec_…"} instead, until Reseal seals them).
-- secret_headers maps a header name to the same object.
ALTER TABLE webhook_endpoints ADD COLUMN secret_headers jsonb NOT NULL DEFAULT '{}';
COMMENT ON COLUMN webhook_endpoints.secrets IS
    '[{"key_id", "sealed", "expires_at"}]: AES-256-GCM under the host''s key key_id; {"secret"} when stored in clear';

-- Endpoint health, shared by every process. The circuit breaker: failures
-- counts consecutive failed requests; at the threshold the breaker is open
-- until open_until, then half-open: one delivery takes the probe's lease
-- (probe_until) and goes, the others wait. The rate limit (GCRA): next_slot
-- is the earliest time of the next request; each delivery takes the slot
-- and moves it on by 1/rate_limit in one UPDATE … RETURNING. One narrow row
-- per endpoint, apart from the wide endpoint row, since every rate-limited
-- delivery updates it.
ALTER TABLE webhook_endpoints ADD COLUMN rate_limit double precision NOT NULL DEFAULT 0
    CHECK (rate_limit >= 0);
CREATE TABLE webhook_endpoint_health (
    endpoint_id  uuid        PRIMARY KEY REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    failures     integer     NOT NULL DEFAULT 0,
    open_until   timestamptz,
    probe_until  timestamptz,
    next_slot    timestamptz
) WITH (fillfactor = 50);
INSERT INTO webhook_endpoint_health (endpoint_id) SELECT id FROM webhook_endpoints;
