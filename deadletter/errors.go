package deadletter

import (
	"errors"
	"fmt"
)

var (
	// ErrNotFound reports a record id the store does not hold (never written, or purged).
	ErrNotFound = errors.New("deadletter: no such dead letter")

	// ErrInvalidInput reports an entry or argument the store refused before changing anything:
	// an entry without a projection, a failing event without an id, a replay without a name
	// of who replays, …
	ErrInvalidInput = errors.New("deadletter: invalid input")

	// ErrInvalidFilter reports a Filter, ReplayFilter or PurgeOptions that selects nothing
	// sensible: an empty replay filter, a limit out of range, an unknown status, …
	ErrInvalidFilter = errors.New("deadletter: invalid filter")

	// ErrUnknownStatus reports a status name that is not one of Statuses().
	ErrUnknownStatus = errors.New("deadletter: unknown status")

	// ErrNotMigrated reports a store whose table does not exist in the database (or schema) it
	// was given: run its Migrate at start-up (deadletter/postgres Store.Migrate, safe from
	// several processes at once), or `nudge migrate`.
	ErrNotMigrated = errors.New("deadletter: the dead-letter table does not exist; run Migrate on the store (deadletter/postgres Store.Migrate) or `nudge migrate` first")
)

// NotFoundError names the record id that was not found. It matches ErrNotFound.
type NotFoundError struct {
	ID int64
}

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("deadletter: no dead letter with ID %d; list the records to find their IDs (purged records are gone)", e.ID)
}

// Is makes errors.Is(err, ErrNotFound) true.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }
