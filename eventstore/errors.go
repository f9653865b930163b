package eventstore

import (
	"errors"
	"fmt"

	"github.com/google/uuid"
)

var (
	// ErrInvalidInput reports a call the store refused before writing anything: an empty stream
	// id, no events, an event without a type, a payload that is not JSON, a bad limit, …
	// The concrete error is a *ValidationError naming the field, or a *TooLargeError.
	ErrInvalidInput = errors.New("eventstore: invalid input")

	// ErrTooLarge reports an append beyond the store's Limits (an event's payload and metadata,
	// the append's in all, or its number of events), refused before anything was sent to the
	// database. The concrete error is a *TooLargeError; it also matches ErrInvalidInput.
	ErrTooLarge = errors.New("eventstore: append too large")

	// ErrNotMigrated reports a store whose tables do not exist in the database (or schema) it
	// was given: run the store's Migrate at start-up (safe from several processes at once), or
	// `nudge migrate`, before appending or reading.
	ErrNotMigrated = errors.New("eventstore: the event store's tables do not exist; run Migrate on the store (eventstore/postgres Store.Migrate) or `nudge migrate` first")

	// ErrWrongExpectedVersion reports that a stream was not at the version the append expected.
	// Nothing was written. The concrete error is a *WrongExpectedVersionError.
	ErrWrongExpectedVersion = errors.New("eventstore: wrong expected version")

	// ErrDuplicateEvent reports that an event ID to append is already stored, and the append is
	// not a repeat of the earlier one (other stream, other versions or only some of the IDs).
	// Nothing was written. The concrete error is a *DuplicateEventError.
	ErrDuplicateEvent = errors.New("eventstore: duplicate event id")

	// ErrConflict reports an append that raced with another transaction in a way that would
	// break the stream's order (see ConflictError). Nothing was written by the append; roll back
	// the transaction and run it again: the retry succeeds or reports the real outcome.
	// Store.Append retries such conflicts itself; AppendTx cannot, because the transaction is
	// the caller's.
	ErrConflict = errors.New("eventstore: conflicting concurrent append; retry the transaction")

	// ErrClosed reports a call on a store whose connection pool has been closed.
	ErrClosed = errors.New("eventstore: store is closed")
)

// ValidationError names the input that was refused. It matches ErrInvalidInput.
type ValidationError struct {
	// Field is the refused argument or field, e.g. "StreamID" or "Payload".
	Field string
	// Index is the position of the offending event in the append, or -1 when the error is not
	// about one event.
	Index int
	// Reason says what was wrong and what is expected.
	Reason string
}

func (e *ValidationError) Error() string {
	if e.Index >= 0 {
		return fmt.Sprintf("eventstore: invalid input: events[%d].%s: %s", e.Index, e.Field, e.Reason)
	}
	return fmt.Sprintf("eventstore: invalid input: %s: %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidInput) true.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalidInput }

// WrongExpectedVersionError is returned when a stream's version differs from the expected one.
// It matches ErrWrongExpectedVersion.
type WrongExpectedVersionError struct {
	StreamID string
	Expected ExpectedVersion
	// Actual is the stream's version when the append was refused; 0 if it has no events.
	Actual int64
}

func (e *WrongExpectedVersionError) Error() string {
	return fmt.Sprintf("eventstore: stream %q is at version %d, the append expected %s; reload the stream and decide again",
		e.StreamID, e.Actual, e.Expected)
}

// Is makes errors.Is(err, ErrWrongExpectedVersion) true.
func (e *WrongExpectedVersionError) Is(target error) bool { return target == ErrWrongExpectedVersion }

// DuplicateEventError is returned when an event ID is already stored and the append is not an
// exact repeat of the earlier append. It matches ErrDuplicateEvent.
type DuplicateEventError struct {
	EventID uuid.UUID
	// StreamID is the stream the append was for.
	StreamID string
}

func (e *DuplicateEventError) Error() string {
	return fmt.Sprintf("eventstore: event id %s is already stored and the append to stream %q is not a repeat of the earlier one; use new ids for new events",
		e.EventID, e.StreamID)
}

// Is makes errors.Is(err, ErrDuplicateEvent) true.
func (e *DuplicateEventError) Is(target error) bool { return target == ErrDuplicateEvent }

// ConflictReason says why an append conflicted.
type ConflictReason string

const (
	// ConflictStreamOrder: the appending transaction was given its transaction id before another
	// transaction committed a later event to the same stream. Written, the new event would be
	// read before the earlier one. Retrying in a new transaction gives it a newer id.
	ConflictStreamOrder ConflictReason = "stream_order"
	// ConflictConcurrentAppend: another transaction appended to the same stream at the same time
	// (for instance both created it, or the database chose this one as a deadlock victim).
	ConflictConcurrentAppend ConflictReason = "concurrent_append"
)

// ConflictError is a retryable append conflict. It matches ErrConflict.
type ConflictError struct {
	StreamID string
	Reason   ConflictReason
	// Err is the underlying database error, if any.
	Err error
}

func (e *ConflictError) Error() string {
	switch e.Reason {
	case ConflictStreamOrder:
		return fmt.Sprintf("eventstore: append to stream %q would break its order: the transaction's id is older than the stream's last committed event; roll back and retry the transaction", e.StreamID)
	default:
		return fmt.Sprintf("eventstore: append to stream %q raced with another append to it; roll back and retry the transaction", e.StreamID)
	}
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// Unwrap returns the underlying database error.
func (e *ConflictError) Unwrap() error { return e.Err }
