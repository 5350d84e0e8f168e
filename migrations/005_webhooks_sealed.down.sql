ALTER TABLE webhook_endpoints DROP COLUMN IF EXISTS enabled_at;
