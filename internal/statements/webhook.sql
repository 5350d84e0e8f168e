-- Package webhook: endpoints, their breakers (webhook_endpoint_health), the
-- attempt log, and the cancelling of River jobs of a disabled endpoint.
--
-- Every statement that reads a whole endpoint returns the same columns, in
-- scanEndpoint's order: id, url, description, types, scopes, headers,
-- secret_headers, secrets, timeout_ms, max_in_flight, rate_limit, enabled,
-- disabled_reason, disabled_at, enabled_at, failing_since, last_success_at,
-- created_at, updated_at.

-- name: CreateEndpoint
-- With its health row, in one statement.
WITH ep AS (
    INSERT INTO /* TEMPLATE: schema */webhook_endpoints
           (id, url, description, types, scopes, headers, secret_headers, secrets, timeout_ms, max_in_flight, rate_limit)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
    RETURNING *),
h AS (INSERT INTO /* TEMPLATE: schema */webhook_endpoint_health (endpoint_id) SELECT id FROM ep)
SELECT id, url, description, types, scopes, headers, secret_headers, secrets, timeout_ms, max_in_flight, rate_limit, enabled,
       coalesce(disabled_reason, ''), disabled_at, enabled_at, failing_since, last_success_at, created_at, updated_at
  FROM ep;

-- name: UpdateEndpoint
UPDATE /* TEMPLATE: schema */webhook_endpoints
   SET url = $2, description = $3, types = $4, scopes = $5, headers = $6, secret_headers = $7, timeout_ms = $8,
       max_in_flight = $9, rate_limit = $10, updated_at = now()
 WHERE id = $1
RETURNING id, url, description, types, scopes, headers, secret_headers, secrets, timeout_ms, max_in_flight, rate_limit, enabled,
          coalesce(disabled_reason, ''), disabled_at, enabled_at, failing_since, last_success_at, created_at, updated_at;

-- name: GetEndpoint
SELECT id, url, description, types, scopes, headers, secret_headers, secrets, timeout_ms, max_in_flight, rate_limit, enabled,
       coalesce(disabled_reason, ''), disabled_at, enabled_at, failing_since, last_success_at, created_at, updated_at
  FROM /* TEMPLATE: schema */webhook_endpoints
 WHERE id = $1;

-- name: GetEndpointForDelivery
-- GetEndpoint with the breaker, and whether the endpoint has a health row.
SELECT id, url, description, types, scopes, headers, secret_headers, secrets, timeout_ms, max_in_flight, rate_limit, enabled,
       coalesce(disabled_reason, ''), disabled_at, enabled_at, failing_since, last_success_at, created_at, updated_at,
       coalesce(h.failures, 0), h.open_until, h.probe_until, h.endpoint_id IS NOT NULL
  FROM /* TEMPLATE: schema */webhook_endpoints
  LEFT JOIN /* TEMPLATE: schema */webhook_endpoint_health h ON h.endpoint_id = id
 WHERE id = $1;

-- name: ListEndpoints
-- $1 after this ID, $2 limit.
SELECT id, url, description, types, scopes, headers, secret_headers, secrets, timeout_ms, max_in_flight, rate_limit, enabled,
       coalesce(disabled_reason, ''), disabled_at, enabled_at, failing_since, last_success_at, created_at, updated_at
  FROM /* TEMPLATE: schema */webhook_endpoints
 WHERE id > $1
 ORDER BY id LIMIT $2;

-- name: MatchingEndpoints
-- The fanout worker's: enabled endpoints taking the scope $1 (every scope
-- when they list none). Type globs are matched in Go. Only what matching
-- needs: not the secrets, which only the delivery opens.
SELECT id, types FROM /* TEMPLATE: schema */webhook_endpoints
 WHERE enabled AND (cardinality(scopes) = 0 OR $1 = ANY(scopes));

-- name: LockSecretHeaders
SELECT secret_headers FROM /* TEMPLATE: schema */webhook_endpoints WHERE id = $1 FOR UPDATE;

-- name: LockSecrets
SELECT secrets FROM /* TEMPLATE: schema */webhook_endpoints WHERE id = $1 FOR UPDATE;

-- name: SetSecrets
UPDATE /* TEMPLATE: schema */webhook_endpoints SET secrets = $2, updated_at = now() WHERE id = $1;

-- name: DisableEndpoint
-- $1 endpoint, $2 reason.
UPDATE /* TEMPLATE: schema */webhook_endpoints
   SET enabled = false, disabled_reason = $2, disabled_at = now(), updated_at = now()
 WHERE id = $1;

-- name: EnableEndpoint
-- enabled_at only moves for an endpoint that was disabled: enabling an
-- enabled endpoint must not cancel what it has pending.
UPDATE /* TEMPLATE: schema */webhook_endpoints
   SET enabled = true, disabled_reason = NULL, disabled_at = NULL,
       enabled_at = CASE WHEN enabled THEN enabled_at ELSE now() END, failing_since = NULL, updated_at = now()
 WHERE id = $1;

-- name: DeleteEndpoint
DELETE FROM /* TEMPLATE: schema */webhook_endpoints WHERE id = $1;

-- name: CancelPending
-- $1 endpoint (as text), $2 batch size: the deliveries to the endpoint that
-- wait in River and were made before it was disabled (all of them once it
-- is deleted; none while it is enabled), cancelled as River's own JobCancel
-- cancels a job that is not running.
WITH cutoff AS (
    SELECT CASE WHEN e.id IS NULL THEN 'infinity' WHEN e.enabled THEN '-infinity' ELSE e.disabled_at END AS t
      FROM (SELECT 1) one LEFT JOIN /* TEMPLATE: schema */webhook_endpoints e ON e.id = $1::text::uuid),
batch AS (
    SELECT id FROM /* TEMPLATE: schema */river_job
     WHERE kind = 'webhook.deliver' AND args @> jsonb_build_object('endpoint_id', $1::text)
       AND state IN ('available', 'scheduled', 'retryable', 'pending') AND created_at <= (SELECT t FROM cutoff)
     LIMIT $2
       FOR UPDATE SKIP LOCKED)
UPDATE /* TEMPLATE: schema */river_job j
   SET state = 'cancelled', finalized_at = now(),
       metadata = j.metadata || jsonb_build_object('cancel_attempted_at', now(), 'webhook_cancelled', 'endpoint disabled')
  FROM batch WHERE j.id = batch.id;

-- name: EndpointSucceeded
UPDATE /* TEMPLATE: schema */webhook_endpoints SET failing_since = NULL, last_success_at = now() WHERE id = $1;

-- name: EndpointFailed
UPDATE /* TEMPLATE: schema */webhook_endpoints SET failing_since = coalesce(failing_since, now()) WHERE id = $1;

-- name: FailingFor
-- $1 endpoint, $2 AutoDisableAfter in ms: whether the enabled endpoint has
-- failed every attempt for that long, its row locked.
SELECT coalesce(failing_since < now() - $2::bigint * interval '1 millisecond', false)
  FROM /* TEMPLATE: schema */webhook_endpoints
 WHERE id = $1 AND enabled
   FOR UPDATE;

-- name: ResealCandidates
-- $1 after this ID, $2 the primary key's ID, $3 batch size: endpoints with a
-- secret or a secret header not sealed under the primary key, locked (a
-- delivery recording its outcome is waited for, not skipped).
SELECT id, secrets, secret_headers FROM /* TEMPLATE: schema */webhook_endpoints
 WHERE id > $1
   AND (EXISTS (SELECT 1 FROM jsonb_array_elements(secrets) s WHERE s->>'key_id' IS DISTINCT FROM $2)
        OR EXISTS (SELECT 1 FROM jsonb_each(secret_headers) h WHERE h.value->>'key_id' IS DISTINCT FROM $2))
 ORDER BY id LIMIT $3
   FOR UPDATE;

-- name: Reseal
UPDATE /* TEMPLATE: schema */webhook_endpoints SET secrets = $2, secret_headers = $3 WHERE id = $1;

-- The circuit breaker and the rate limit, one row per endpoint.

-- name: CreateHealth
-- For an endpoint created by a 0.1.0 process after migration 005.
INSERT INTO /* TEMPLATE: schema */webhook_endpoint_health (endpoint_id) VALUES ($1) ON CONFLICT DO NOTHING;

-- name: Admit
-- $1 endpoint, $2 BreakerThreshold, $3 a probe's lease in µs, $4 the rate
-- limit's interval in µs (0: none). A closed breaker admits; an open one
-- whose interval passed admits one probe (probe_until is its lease); the
-- rate limit reserves the next slot. No row: the breaker is open.
UPDATE /* TEMPLATE: schema */webhook_endpoint_health h
   SET probe_until = CASE WHEN h.failures >= $2 THEN now() + $3::bigint * interval '1 microsecond' ELSE h.probe_until END,
       next_slot = CASE WHEN $4::bigint > 0 THEN greatest(h.next_slot, now()) + $4::bigint * interval '1 microsecond' ELSE h.next_slot END
 WHERE h.endpoint_id = $1
   AND (h.failures < $2 OR (coalesce(h.open_until, '-infinity') <= now() AND coalesce(h.probe_until, '-infinity') <= now()))
RETURNING h.failures >= $2, coalesce(h.next_slot - $4::bigint * interval '1 microsecond', now());

-- name: BreakerState
SELECT open_until, probe_until FROM /* TEMPLATE: schema */webhook_endpoint_health WHERE endpoint_id = $1;

-- name: BreakerClose
UPDATE /* TEMPLATE: schema */webhook_endpoint_health SET failures = 0, open_until = NULL, probe_until = NULL
 WHERE endpoint_id = $1 AND (failures <> 0 OR open_until IS NOT NULL OR probe_until IS NOT NULL);

-- name: BreakerFail
-- $1 endpoint, $2 BreakerThreshold, $3 BreakerInterval in µs, $4 whether the
-- request was the probe (its failure ends its lease).
UPDATE /* TEMPLATE: schema */webhook_endpoint_health
   SET failures = failures + 1,
       open_until = CASE WHEN failures + 1 >= $2 THEN now() + $3::bigint * interval '1 microsecond' ELSE open_until END,
       probe_until = CASE WHEN $4::boolean THEN NULL ELSE probe_until END
 WHERE endpoint_id = $1;

-- name: Health
-- $1 endpoint IDs (empty: all), $2 the window in µs: each endpoint's
-- breaker and its requests' record, by the attempt log's (endpoint, time)
-- index; attempts that sent nothing are left out.
SELECT e.id, e.rate_limit, coalesce(h.failures, 0), h.open_until, h.probe_until,
       coalesce(a.n, 0), coalesce(a.ok, 0), coalesce(a.p50, 0), coalesce(a.p95, 0), coalesce(a.p99, 0)
  FROM /* TEMPLATE: schema */webhook_endpoints e
  LEFT JOIN /* TEMPLATE: schema */webhook_endpoint_health h ON h.endpoint_id = e.id
  LEFT JOIN LATERAL (
       SELECT count(*) AS n, count(*) FILTER (WHERE error_class = '') AS ok,
              percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ms) AS p50,
              percentile_cont(0.95) WITHIN GROUP (ORDER BY duration_ms) AS p95,
              percentile_cont(0.99) WITHIN GROUP (ORDER BY duration_ms) AS p99
         FROM /* TEMPLATE: schema */webhook_attempts
        WHERE endpoint_id = e.id AND created_at > now() - $2::bigint * interval '1 microsecond'
          AND error_class NOT IN ('secret', 'payload', 'request')) a ON true
 WHERE cardinality($1::uuid[]) = 0 OR e.id = ANY($1)
 ORDER BY e.id;

-- The attempt log.

-- name: InsertAttempt
INSERT INTO /* TEMPLATE: schema */webhook_attempts
       (endpoint_id, event_id, attempt, status, error_class, error, duration_ms, dialed_ip, response)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: ListAttempts
-- $1 endpoint or NULL, $2 event or NULL, $3 failures only, $4 before this ID
-- or NULL, $5 limit. Newest first.
SELECT id, endpoint_id, event_id, attempt, status, error_class, error, duration_ms, dialed_ip, response, created_at
  FROM /* TEMPLATE: schema */webhook_attempts
 WHERE ($1::uuid IS NULL OR endpoint_id = $1) AND ($2::uuid IS NULL OR event_id = $2)
   AND (NOT $3 OR error_class <> '') AND ($4::bigint IS NULL OR id < $4)
 ORDER BY id DESC LIMIT $5;

-- name: PruneAttempts
-- $1 older than this, $2 batch size.
DELETE FROM /* TEMPLATE: schema */webhook_attempts
 WHERE id IN (SELECT id FROM /* TEMPLATE: schema */webhook_attempts WHERE created_at < $1 ORDER BY created_at LIMIT $2);

-- name: FailedEvents
-- $1 endpoint, [$2, $3) a time range: the events whose delivery to it
-- failed then and never succeeded afterwards.
SELECT DISTINCT a.event_id FROM /* TEMPLATE: schema */webhook_attempts a
 WHERE a.endpoint_id = $1 AND a.error_class <> '' AND a.created_at >= $2 AND a.created_at < $3
   AND NOT EXISTS (SELECT 1 FROM /* TEMPLATE: schema */webhook_attempts s
                    WHERE s.endpoint_id = a.endpoint_id AND s.event_id = a.event_id
                      AND s.error_class = '' AND s.created_at > a.created_at);
