-- Back to version 013.
DROP TRIGGER IF EXISTS outbox_recorded ON outbox_events;
DROP FUNCTION IF EXISTS outbox_note_recorded();
DROP FUNCTION IF EXISTS outbox_recorded_in_tx();
