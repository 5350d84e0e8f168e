-- Webhooks (package webhook), after 0.1.0: re-enabling an endpoint
-- invalidates the deliveries that were pending when it was disabled.

-- When the endpoint was last enabled again after a disable; NULL if never.
-- A delivery created before it was pending at disable time and is cancelled.
ALTER TABLE webhook_endpoints ADD COLUMN enabled_at timestamptz;
