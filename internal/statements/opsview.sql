-- Read-only queries for an operator's view (package eventsui): what became
-- of an event's River jobs, and how fan-out went minute by minute. River's
-- tables live in the library's schema (Migrate puts both there).

-- name: FanoutJobs
-- $1 event ID: each job of its fanout, joined to River's job by ID.
SELECT f.subscriber, f.job_id, j.id IS NOT NULL, coalesce(j.state::text, ''), coalesce(j.kind, ''),
       coalesce(j.attempt, 0), coalesce(j.max_attempts, 0),
       coalesce(j.errors[array_upper(j.errors, 1)] ->> 'error', ''), j.attempted_at, j.finalized_at
  FROM /* TEMPLATE: schema */outbox_events e
 CROSS JOIN LATERAL (SELECT key, value::bigint FROM jsonb_each_text(e.fanout)) AS f(subscriber, job_id)
  LEFT JOIN /* TEMPLATE: schema */river_job j ON j.id = f.job_id
 WHERE e.id = $1
 ORDER BY f.subscriber;

-- name: FanoutByMinute
-- $1 since. The range condition on fanned_out_at and the index's own
-- predicate (fanned_out_at IS NOT NULL AND poisoned_at IS NULL) let the
-- planner read outbox_events_fanned_idx over the range only.
WITH m AS (
    SELECT date_trunc('minute', fanned_out_at) AS minute, count(*) AS n,
           extract(epoch FROM max(fanned_out_at - created_at)) AS max_lag
      FROM /* TEMPLATE: schema */outbox_events
     WHERE fanned_out_at >= date_trunc('minute', $1::timestamptz)
       AND fanned_out_at IS NOT NULL AND poisoned_at IS NULL
     GROUP BY 1)
SELECT g.minute, coalesce(m.n, 0), coalesce(m.max_lag, 0)
  FROM generate_series(date_trunc('minute', $1::timestamptz), date_trunc('minute', now()), interval '1 minute') AS g(minute)
  LEFT JOIN m USING (minute)
 ORDER BY g.minute;

-- name: DeliveriesBySubscriber
SELECT subscriber, count(*) FILTER (WHERE poisoned_at IS NULL),
       min(created_at) FILTER (WHERE poisoned_at IS NULL), count(*) FILTER (WHERE poisoned_at IS NOT NULL)
  FROM /* TEMPLATE: schema */outbox_deliveries
 GROUP BY subscriber;
