-- The outbox: one row per recorded event. Rows are claimed by relays with
-- FOR UPDATE SKIP LOCKED while fanned_out_at and poisoned_at are NULL; seq
-- only orders the claim, it is never used as a cursor.
CREATE TABLE outbox_events (
    seq             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id              uuid        NOT NULL,
    type            text        NOT NULL,
    subject         text        NOT NULL DEFAULT '',
    payload         jsonb       NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    fanned_out_at   timestamptz,
    fanout          jsonb,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at timestamptz,
    poisoned_at     timestamptz,
    CONSTRAINT outbox_events_id_key UNIQUE (id),
    CONSTRAINT outbox_events_type_check CHECK (type <> '' AND length(type) <= 255),
    CONSTRAINT outbox_events_subject_check CHECK (length(subject) <= 255)
);

-- Exactly the rows a relay round reads: stays small however many fanned-out
-- rows the table keeps.
CREATE INDEX outbox_events_pending_idx ON outbox_events (seq)
    WHERE fanned_out_at IS NULL AND poisoned_at IS NULL;

-- Rows that failed at least once and wait for their next attempt.
CREATE INDEX outbox_events_retry_idx ON outbox_events (next_attempt_at)
    WHERE fanned_out_at IS NULL AND poisoned_at IS NULL AND attempts > 0;

-- The operator's list of poisoned events, newest first.
CREATE INDEX outbox_events_poisoned_idx ON outbox_events (poisoned_at DESC, seq DESC)
    WHERE poisoned_at IS NOT NULL;
