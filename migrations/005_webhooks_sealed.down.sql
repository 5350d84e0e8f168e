-- Secrets sealed by Config.Keys cannot be opened in SQL: before going down,
-- the endpoints' secrets must be re-created (0.1.0 reads {"secret"} only).
-- Secret headers are dropped with their column.
DROP TABLE IF EXISTS webhook_endpoint_health;
ALTER TABLE webhook_endpoints DROP COLUMN IF EXISTS rate_limit;
ALTER TABLE webhook_endpoints DROP COLUMN IF EXISTS secret_headers;
COMMENT ON COLUMN webhook_endpoints.secrets IS NULL;
ALTER TABLE webhook_endpoints DROP COLUMN IF EXISTS enabled_at;
