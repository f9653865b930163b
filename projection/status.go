package projection

import (
	"time"

	"github.com/google/uuid"

	"github.com/nudgeworks/nudge/eventstore"
)

// Status is a projection's stored state plus its lag against the event store.
type Status struct {
	Name     string
	State    State
	Position eventstore.Position
	// EventsProcessed counts the events handled since the projection was created or last reset.
	EventsProcessed int64

	// LastError is the error of the most recent failure, empty when running normally.
	LastError string
	// FailingEvent is the event the projection stopped at; nil unless failing.
	FailingEvent *FailingEvent
	// Attempts counts the recorded failures on FailingEvent.
	Attempts       int
	FirstFailureAt time.Time
	LastFailureAt  time.Time

	// LastSkip is the most recent event an operator skipped; nil if none.
	LastSkip *SkipRecord

	// RebuildStartedAt is when the last Reset happened; zero if never.
	RebuildStartedAt time.Time
	UpdatedAt        time.Time

	// Head is the newest event the store can be read up to now (any type).
	Head eventstore.Position
	// LagEvents counts readable events of the projection's types after Position.
	LagEvents int64
	// LagTime is the age of the oldest of those events; zero when there are none.
	LagTime time.Duration
	// HeldByHorizon reports committed events of the projection's types that cannot be read yet
	// because an older transaction is still open somewhere in the database cluster: the
	// projection is waiting on that transaction, not on work. It never skips them.
	HeldByHorizon bool
	// OldestOpenTransaction is the age of the oldest writing transaction that holds readers
	// back, when HeldByHorizon is true and the server lets us see it; zero otherwise.
	OldestOpenTransaction time.Duration
}

// FailingEvent names the event a projection failed on.
type FailingEvent struct {
	Position eventstore.Position
	ID       uuid.UUID
	Type     string
	StreamID string
}

// CaughtUp reports whether the projection has nothing readable left to do.
func (s Status) CaughtUp() bool { return s.LagEvents == 0 }

// EventsPerSecond is the average rate since the last reset while rebuilding, else 0.
func (s Status) EventsPerSecond(now time.Time) float64 {
	if s.State != StateRebuilding || s.RebuildStartedAt.IsZero() {
		return 0
	}
	elapsed := now.Sub(s.RebuildStartedAt).Seconds()
	if elapsed <= 0 {
		return 0
	}
	return float64(s.EventsProcessed) / elapsed
}

// Progress returns events done and the total for a rebuild: done is EventsProcessed, the total
// adds what is still to read.
func (s Status) Progress() (done, total int64) {
	return s.EventsProcessed, s.EventsProcessed + s.LagEvents
}
