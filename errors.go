package events

import "errors"

// Sentinel errors. Functions wrap them with details; check with [errors.Is].
var (
	// ErrInvalidEvent is returned by [Record] and [RecordMany] for an event
	// that cannot be stored. The wrapping error names the field. Nothing was
	// sent to the database, so the caller's transaction is still usable.
	ErrInvalidEvent = errors.New("events: invalid event")

	// ErrInvalidSubscriber is returned by [Relay.Subscribe] for a subscriber
	// that cannot be registered. The wrapping error names the field.
	ErrInvalidSubscriber = errors.New("events: invalid subscriber")

	// ErrInvalidConfig is returned by [NewRelay], [NewAwaiter], [Migrate] and
	// the [Outbox] methods for a configuration that cannot work (a bad
	// Schema, say). The wrapping error names the field.
	ErrInvalidConfig = errors.New("events: invalid config")

	// ErrInvalidWatch is returned by [InstallWatch] for a watch that cannot
	// be installed: a missing table or column, or a bad field.
	ErrInvalidWatch = errors.New("events: invalid watch")

	// ErrNotFound is returned for an event ID that does not exist.
	ErrNotFound = errors.New("events: event not found")

	// ErrPoisoned is returned by [Awaiter.AwaitFanout] for an event that the
	// relay set aside after repeated failures. See [Requeue].
	ErrPoisoned = errors.New("events: event poisoned")

	// ErrUnknownSubscriber is returned by [RetireSubscriber] for a name that
	// no relay ever registered.
	ErrUnknownSubscriber = errors.New("events: unknown subscriber")

	// ErrNotPoisoned is returned by [Requeue] for an event that is not
	// poisoned.
	ErrNotPoisoned = errors.New("events: event not poisoned")

	// ErrNotRunning is returned by [Awaiter.AwaitFanout] when the awaiter is
	// not started, or stops during the wait.
	ErrNotRunning = errors.New("events: not running")

	// ErrStarted is returned when a relay is configured after it started, or
	// a relay or an awaiter is started twice.
	ErrStarted = errors.New("events: already started")
)
