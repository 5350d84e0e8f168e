-- Back to version 011.
DROP FUNCTION outbox_chain_complete(bigint[], integer[], text, text, integer, integer);
DROP FUNCTION outbox_chain_prepare(text[], text[], bigint[], bigint[], text[], boolean[], bigint[], bigint[], bigint[], text[], integer, boolean[]);

-- outbox_chain_sweep as 008 made it.
CREATE OR REPLACE FUNCTION outbox_chain_sweep(subs text[], continue_subs text[], lim integer, p_channel text, lock_class integer)
RETURNS TABLE (subscriber text, subject text, job_id bigint, action text, state text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    s text;
    r record;
    a record;
BEGIN
    FOREACH s IN ARRAY subs LOOP
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(lock_class, hashtext(s));
        FOR r IN
            SELECT c.subject, c.head_job, c.blocked_at IS NOT NULL AS blocked, j.id IS NOT NULL AS found, j.state::text AS jstate,
                   j.errors[array_upper(j.errors, 1)]->>'error' AS last_error
              FROM outbox_chains c LEFT JOIN river_job j ON j.id = c.head_job
             WHERE c.subscriber = s AND c.head_job IS NOT NULL
               AND ((c.blocked_at IS NULL AND (j.id IS NULL OR j.state IN ('completed', 'cancelled', 'discarded')))
                 OR (c.blocked_at IS NOT NULL AND j.id IS NOT NULL AND j.state NOT IN ('cancelled', 'discarded')))
             LIMIT lim
               FOR UPDATE OF c SKIP LOCKED
        LOOP
            IF r.blocked THEN
                UPDATE outbox_chains SET blocked_at = NULL, blocked_state = NULL, blocked_error = NULL
                 WHERE outbox_chains.subscriber = s AND outbox_chains.subject = r.subject;
                RETURN QUERY SELECT s, r.subject, r.head_job, 'unblocked'::text, r.jstate;
            ELSIF r.jstate = 'completed' OR s = ANY(continue_subs) THEN
                SELECT * INTO a FROM outbox_chain_advance(r.head_job, NULL, p_channel);
                RETURN QUERY SELECT s, r.subject, r.head_job,
                    CASE WHEN r.jstate = 'completed' THEN 'released' ELSE 'skipped' END, coalesce(r.jstate, 'deleted');
            ELSE
                UPDATE outbox_chains SET blocked_at = now(), blocked_state = coalesce(r.jstate, 'deleted'), blocked_error = r.last_error
                 WHERE outbox_chains.subscriber = s AND outbox_chains.subject = r.subject;
                RETURN QUERY SELECT s, r.subject, r.head_job, 'blocked'::text, coalesce(r.jstate, 'deleted');
            END IF;
        END LOOP;
        DELETE FROM outbox_chains c
         WHERE (c.subscriber, c.subject) IN (
            SELECT e.subscriber, e.subject FROM outbox_chains e
             WHERE e.subscriber = s AND e.head_job IS NULL AND e.blocked_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM outbox_chain_jobs l WHERE l.subscriber = e.subscriber AND l.subject = e.subject)
             LIMIT lim
               FOR UPDATE SKIP LOCKED);
    END LOOP;
END
$$;
