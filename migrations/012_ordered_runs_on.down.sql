-- Back to version 011.
DROP FUNCTION outbox_chain_complete(bigint[], integer[], text, text, integer, integer);
