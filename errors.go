package events

import (
	"errors"
	"fmt"

	"github.com/google/uuid"
)

// Sentinel errors. Every error the library decides on wraps one of them;
// check with [errors.Is]. Errors of the database are wrapped as they come
// (check them with pgx's types).
var (
	// ErrInvalidEvent is returned by [Record], [RecordMany] and [Validate]
	// for an event that cannot be stored, as a [*ValidationError] naming the
	// field. Nothing was sent to the database, so the caller's transaction
	// is still usable.
	ErrInvalidEvent = errors.New("events: invalid event")

	// ErrInvalidSubscriber is returned by [Relay.Subscribe] for a subscriber
	// that cannot be registered, as a [*ValidationError] naming the field.
	ErrInvalidSubscriber = errors.New("events: invalid subscriber")

	// ErrInvalidConfig is returned by [NewRelay], [NewAwaiter], [Outbox.Migrate] and
	// the [Outbox] methods for a configuration that cannot work (a bad
	// Schema, say), as a [*ValidationError] naming the field.
	ErrInvalidConfig = errors.New("events: invalid config")

	// ErrInvalidArgument is returned for a bad argument to an operator
	// function (a page size out of range, a cursor that is not one), as a
	// [*ValidationError] naming it.
	ErrInvalidArgument = errors.New("events: invalid argument")

	// ErrInvalidWatch is returned by [Outbox.InstallWatch] for a watch that cannot
	// be installed: a missing table or column, or a bad field.
	ErrInvalidWatch = errors.New("events: invalid watch")

	// ErrNotFound is returned for an event ID that does not exist (never
	// committed, or deleted).
	ErrNotFound = errors.New("events: event not found")

	// ErrPoisoned is returned by [Awaiter.AwaitFanout] for an event that the
	// relay set aside after repeated failures, as a [*PoisonedError]. See
	// [Outbox.Requeue].
	ErrPoisoned = errors.New("events: event poisoned")

	// ErrNotPoisoned is returned by [Outbox.Requeue] for an event that is not
	// poisoned.
	ErrNotPoisoned = errors.New("events: event not poisoned")

	// ErrUnknownSubscriber is returned by [Outbox.RetireSubscriber] for a name that
	// no relay ever registered.
	ErrUnknownSubscriber = errors.New("events: unknown subscriber")

	// ErrNotRunning is returned by [Awaiter.AwaitFanout] when the awaiter is
	// not started, or stops during the wait.
	ErrNotRunning = errors.New("events: not running")

	// ErrStarted is returned when a relay is configured after it started, or
	// a relay or an awaiter is started twice.
	ErrStarted = errors.New("events: already started")
)

// ValidationError is a refused input: which field, and why. It matches its
// sentinel ([ErrInvalidEvent], [ErrInvalidSubscriber], [ErrInvalidConfig],
// [ErrInvalidArgument] or [ErrInvalidWatch]; package webhook's
// ErrInvalidEndpoint) with [errors.Is]. Every package of the library reports
// a refused config, argument or input as one.
type ValidationError struct {
	// Kind is the sentinel: what was refused.
	Kind error
	// Field names the field or argument, as in the Go API ("Payload",
	// "BatchSize", "Listener.PollInterval").
	Field string
	// Reason says what is wrong with it.
	Reason string
	// Err is the cause, when the refusal has one to check with [errors.Is]
	// (package webhook's ErrForbiddenAddress for a URL refused for its
	// address, say). Usually nil.
	Err error
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("%v: %s %s", e.Kind, e.Field, e.Reason)
}

// Unwrap returns the sentinel and the cause, for [errors.Is] and
// [errors.As].
func (e *ValidationError) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

func invalidf(kind error, field, format string, args ...any) *ValidationError {
	return &ValidationError{Kind: kind, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// PoisonedError is an event set aside after repeated failures, as
// [Awaiter.AwaitFanout] reports it. It matches [ErrPoisoned] with
// [errors.Is].
type PoisonedError struct {
	// EventID is the poisoned event.
	EventID uuid.UUID
	// Subscriber is the subscriber for which it is poisoned
	// ([Awaiter.AwaitDelivery]); empty when the event is poisoned as a
	// whole.
	Subscriber string
	// LastError is the error of its last attempt.
	LastError string
}

func (e *PoisonedError) Error() string {
	if e.Subscriber != "" {
		return fmt.Sprintf("%v: %s for %q: %s", ErrPoisoned, e.EventID, e.Subscriber, e.LastError)
	}
	return fmt.Sprintf("%v: %s: %s", ErrPoisoned, e.EventID, e.LastError)
}

// Is reports whether target is [ErrPoisoned].
func (e *PoisonedError) Is(target error) bool { return target == ErrPoisoned }
