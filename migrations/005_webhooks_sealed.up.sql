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
