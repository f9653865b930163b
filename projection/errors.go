package projection

import (
	"errors"
	"fmt"

	"github.com/nudgeworks/nudge/eventstore"
)

var (
	// ErrInvalidConfig reports a projection or runner definition that cannot work: no handlers,
	// two handlers for one event type, a batch size out of range, two projections with one name…
	ErrInvalidConfig = errors.New("projection: invalid configuration")

	// ErrUnknownProjection reports a name the runner has no projection for.
	ErrUnknownProjection = errors.New("projection: unknown projection")

	// ErrAlreadyRunning reports a Run of a Poller (or a relay.Relay) while another Run of it
	// has not returned yet. Once it has, Run may be called again.
	ErrAlreadyRunning = errors.New("projection: already running; Run may be called again once the running one has returned")

	// ErrUnknownState reports a state name that is not one of States().
	ErrUnknownState = errors.New("projection: unknown state")

	// ErrNeedsTransaction reports a projection with transactional handlers (On) registered with
	// a backend that has no database transaction (the memory backend).
	ErrNeedsTransaction = errors.New("projection: handlers need a PostgreSQL transaction")

	// ErrNotRegistered reports a projection the backend has no status row for: run Runner.Init
	// (after migrating the backend) before catching up.
	ErrNotRegistered = errors.New("projection: not registered; run Runner.Init first")

	// ErrNotMigrated reports a backend whose tables do not exist in the database (or schema) it
	// was given: run its Migrate at start-up (projection/postgres Backend.Migrate, safe from
	// several processes at once), or `nudge migrate`. Runner.Init and worker.Run return it at
	// start rather than fail at every catch-up.
	ErrNotMigrated = errors.New("projection: the projection status tables do not exist; run Migrate on the backend (projection/postgres Backend.Migrate) or `nudge migrate` first")

	// ErrSkipRefused reports a skip the runner would not do: the event is not the one the
	// projection fails on (without Force), or not the next event it would handle.
	ErrSkipRefused = errors.New("projection: skip refused")

	// ErrCrashLoop matches every *CrashLoopError.
	ErrCrashLoop = errors.New("projection: the process keeps dying on this event")

	// ErrAttemptNotRecorded is returned by a Backend's StartAttempt that could not record a
	// batch's start in time (no free database connection): the batch runs without crash-loop
	// tracking instead of waiting.
	ErrAttemptNotRecorded = errors.New("projection: the batch's start could not be recorded in time")

	// ErrBatchTimeout reports a batch (a cut-over, or the write recording a failure) that did not finish
	// within Config.BatchTimeout: the database stalled or a lock was held. The batch rolled
	// back; nothing was recorded as the projection's failure. Retry later.
	ErrBatchTimeout = errors.New("projection: the batch did not finish within BatchTimeout (is the database reachable, or a lock held?); it rolled back")

	// ErrNotRetired reports a Runner.DropRetired of a version that is not retired: only a
	// version a newer one has replaced may lose its read model this way.
	ErrNotRetired = errors.New("projection: the version is not retired; only a version a newer one replaced can be dropped")

	// ErrHandler matches every *HandlerError.
	ErrHandler = errors.New("projection: handler failed")

	// ErrDecode matches every *DecodeError.
	ErrDecode = errors.New("projection: event payload does not decode")
)

// HandlerError reports the event a projection's handler failed on. The runner returns it from
// CatchUp after it has committed the events before this one and recorded the failure in the
// projection's status. It matches ErrHandler and unwraps to the handler's error.
type HandlerError struct {
	// Projection is the projection whose handler failed.
	Projection string
	// Event is the event the handler failed on.
	Event eventstore.EventRef
	// Err is the handler's error.
	Err error
	// unattributed: a flush hook's error that named no event (charged to the batch's first);
	// such a failure is never parked.
	unattributed bool
}

func (e *HandlerError) Error() string {
	return fmt.Sprintf("projection %s: handling event %s (type %s, stream %q, position %s): %v",
		e.Projection, e.Event.ID, e.Event.Type, e.Event.StreamID, e.Event.Position, e.Err)
}

// Is makes errors.Is(err, ErrHandler) true.
func (e *HandlerError) Is(target error) bool { return target == ErrHandler }

// Unwrap returns the handler's error.
func (e *HandlerError) Unwrap() error { return e.Err }

// DecodeError reports an event payload that does not decode into the handler's type. It
// matches ErrDecode; the runner wraps it in a *HandlerError.
type DecodeError struct {
	EventType string
	// Target is the Go type the handler expects, e.g. "tickets.TicketWasRegistered".
	Target string
	Err    error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("payload of %s does not decode into %s: %v", e.EventType, e.Target, e.Err)
}

// Is makes errors.Is(err, ErrDecode) true.
func (e *DecodeError) Is(target error) bool { return target == ErrDecode }

// Unwrap returns the JSON error.
func (e *DecodeError) Unwrap() error { return e.Err }

func invalidConfig(projection, format string, args ...any) error {
	return fmt.Errorf("%w: projection %s: %s", ErrInvalidConfig, projection, fmt.Sprintf(format, args...))
}

// CrashLoopError is the error recorded for an event during which the process stopped again and
// again (a crash outside any recover, an OOM kill, os.Exit): the runner no longer hands it to
// the handler, so the process survives. It matches ErrCrashLoop.
type CrashLoopError struct {
	// Starts is how many times a batch with the event started without finishing.
	Starts int
}

func (e *CrashLoopError) Error() string {
	return fmt.Sprintf("the process stopped %d times while handling this event (a crash, an OOM kill, os.Exit…); "+
		"it is treated as poison and not handled again: fix the handler, then replay the projection, or skip the event", e.Starts)
}

// Is makes errors.Is(err, ErrCrashLoop) true.
func (e *CrashLoopError) Is(target error) bool { return target == ErrCrashLoop }
