-- Paging through events by state, for operators: one query per state, each
-- through its own partial index. All take the same five parameters: $1
-- limit, $2 type regexp (see glob.Pattern.Regexp) or NULL, $3 subject or
-- NULL, $4 and $5 the cursor (seq, and the ordering time where the order
-- has one) or NULL. $5 is unused in seq order, but typed there all the same.

-- name: ListPending
SELECT seq, id, type, subject, scope, payload, created_at, fanned_out_at, fanout, attempts, last_error, next_attempt_at, poisoned_at
  FROM /* TEMPLATE: schema */outbox_events
 WHERE fanned_out_at IS NULL AND poisoned_at IS NULL AND attempts = 0
   AND ($2::text IS NULL OR ('.' || type) ~ $2) AND ($3::text IS NULL OR subject = $3)
   AND ($4::bigint IS NULL OR (seq > $4 AND $5::timestamptz IS NOT NULL))
 ORDER BY seq LIMIT $1;

-- name: ListRetrying
SELECT seq, id, type, subject, scope, payload, created_at, fanned_out_at, fanout, attempts, last_error, next_attempt_at, poisoned_at
  FROM /* TEMPLATE: schema */outbox_events
 WHERE fanned_out_at IS NULL AND poisoned_at IS NULL AND attempts > 0
   AND ($2::text IS NULL OR ('.' || type) ~ $2) AND ($3::text IS NULL OR subject = $3)
   AND ($4::bigint IS NULL OR (seq > $4 AND $5::timestamptz IS NOT NULL))
 ORDER BY seq LIMIT $1;

-- name: ListPoisoned
-- Poisoned as a whole, or for some subscriber: such an event shows its
-- latest poisoned pair's time, attempts and error. Newest first.
SELECT seq, id, type, subject, scope, payload, created_at, fanned_out_at, fanout, attempts, last_error, next_attempt_at, poisoned_at
  FROM (SELECT seq, id, type, subject, scope, payload, created_at, fanned_out_at, fanout, attempts, last_error, next_attempt_at, poisoned_at
          FROM /* TEMPLATE: schema */outbox_events
         WHERE poisoned_at IS NOT NULL
        UNION ALL
        SELECT e.seq, e.id, e.type, e.subject, e.scope, e.payload, e.created_at, e.fanned_out_at, e.fanout,
               p.attempts, p.last_error, e.next_attempt_at, p.poisoned_at
          FROM (SELECT DISTINCT ON (event_seq) event_seq, attempts, last_error, poisoned_at
                  FROM /* TEMPLATE: schema */outbox_deliveries
                 WHERE poisoned_at IS NOT NULL
                 ORDER BY event_seq, poisoned_at DESC) p
          JOIN /* TEMPLATE: schema */outbox_events e ON e.seq = p.event_seq
         WHERE e.poisoned_at IS NULL) x
 WHERE ($2::text IS NULL OR ('.' || type) ~ $2) AND ($3::text IS NULL OR subject = $3)
   AND ($4::bigint IS NULL OR (poisoned_at, seq) < ($5::timestamptz, $4))
 ORDER BY poisoned_at DESC, seq DESC LIMIT $1;

-- name: ListRecent
-- Fanned out, most recently first.
SELECT seq, id, type, subject, scope, payload, created_at, fanned_out_at, fanout, attempts, last_error, next_attempt_at, poisoned_at
  FROM /* TEMPLATE: schema */outbox_events
 WHERE fanned_out_at IS NOT NULL AND poisoned_at IS NULL
   AND ($2::text IS NULL OR ('.' || type) ~ $2) AND ($3::text IS NULL OR subject = $3)
   AND ($4::bigint IS NULL OR (fanned_out_at, seq) < ($5::timestamptz, $4))
 ORDER BY fanned_out_at DESC, seq DESC LIMIT $1;
