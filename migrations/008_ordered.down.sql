-- Back to version 006: the chains go. River's jobs stay as they are; jobs
-- still pending in a chain are left pending (River never works a pending
-- job): release or cancel them in River UI, or skip the chains first.
DROP FUNCTION IF EXISTS outbox_chain_skip(text, text, text);
DROP FUNCTION IF EXISTS outbox_chain_resume(text, text, text);
DROP FUNCTION IF EXISTS outbox_chain_sweep(text[], text[], integer, text, integer);
DROP FUNCTION IF EXISTS outbox_chain_advance(bigint, integer, text);
DROP FUNCTION IF EXISTS outbox_chain_prepare(text[], text[], bigint[], text[], boolean[], bigint[], bigint[], bigint[], text[], integer);
DROP FUNCTION IF EXISTS outbox_chain_blockers(text[], text[], bigint[], text[], boolean[], bigint[], bigint[], text[]);
ALTER TABLE outbox_deliveries DROP COLUMN IF EXISTS deferrals;
DROP TABLE IF EXISTS outbox_chain_jobs;
DROP TABLE IF EXISTS outbox_chains;
