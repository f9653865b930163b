package projection

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection/internal/seal"
)

// Backend keeps projection positions and status, and runs batches as units of work. It is a
// plug-in point of this module with two implementations: projection/postgres (positions in the
// event store's database, one transaction per batch) and projection/memory (for the memory event
// store). The shared suite in projection/projectiontest checks both.
//
// Backend is not for implementation outside this module: its contract changes with the runner,
// and its Seal method takes a type only the module's packages can name (see
// projection/internal/seal). Wrap one of the module's backends (embed it) to decorate it.
//
// A backend provides the units of work and the state changes; the runner runs the projection's
// hooks (Config.InitFunc, ResetFunc, DeleteFunc), which a backend receives as a HookFunc and
// runs inside the unit of the state change.
//
// Partitioned projections (Config.Partitions): Register, Reset, SetState(By) and Delete receive the
// projection's definition and act on all of its units (Projection.Units) in one unit of work —
// the hook runs once, and Reset, SetState(By) and Delete take the units' locks in index order;
// Register refuses a changed partition count with a *PartitionCountError. Every other method
// receives one unit (a partition) and keys its row by the unit's name; its reads use
// Projection.Partition.
type Backend interface {
	// Register creates the projection's status row if it is missing and runs init (if not nil)
	// in the same unit, holding the projection's lock.
	Register(ctx context.Context, p *Projection, init HookFunc) error
	// RunBatch runs fn in one unit of work that holds the projection's lock (in PostgreSQL: one
	// transaction holding an advisory lock on the projection's name, which serialises every
	// worker of the projection, in any process). If fn returns nil, the unit stores fn's Outcome and commits;
	// otherwise it rolls back and returns fn's error. When ahead is not nil, the unit's first
	// Read with exactly ahead's position and options may return events the backend read
	// under the lock before fn ran (see ReadAhead).
	RunBatch(ctx context.Context, p *Projection, ahead *ReadAhead, fn BatchFunc) error
	// RecordFailure stores a handler failure in the status row, in a unit of its own, unless
	// the projection has meanwhile moved past the failing event.
	RecordFailure(ctx context.Context, p *Projection, f Failure) error
	// Reset runs hook (if not nil), then sets the position to the start, the state to
	// rebuilding and clears the counters and failure, in one unit.
	Reset(ctx context.Context, p *Projection, hook HookFunc) error
	// SetState is SetStateBy with by empty.
	SetState(ctx context.Context, p *Projection, to State, from ...State) (bool, error)
	// SetStateBy changes the state to to if the current state is one of from (any state when
	// from is empty), and reports whether it changed. A change to StatePaused, or from it,
	// records by and the time on each unit that changed (Status.StateChangedBy and
	// StateChangedAt); a unit left alone keeps what it recorded.
	SetStateBy(ctx context.Context, p *Projection, by string, to State, from ...State) (bool, error)
	// Delete runs hook (if not nil), then removes the status row, in one unit.
	Delete(ctx context.Context, p *Projection, hook HookFunc) error
	// Status returns the status row with the lag fields computed against the store.
	Status(ctx context.Context, p *Projection) (Status, error)
	// Parked returns the projection's parked streams, oldest first, without waiting for a
	// batch in flight.
	Parked(ctx context.Context, p *Projection) ([]ParkedStream, error)

	// StartAttempt records, in a unit of its own that commits at once, that a batch starting
	// after position at is about to run handlers. It returns how many batches have started there
	// without finishing, this one included, and the careful range. A batch that commits, or a
	// recorded failure, finishes the attempt. When careful is not zero, the careful range is
	// extended to it and the count restarts at this attempt.
	StartAttempt(ctx context.Context, p *Projection, at, careful eventstore.Position) (Attempt, error)
	// EndAttempt forgets the batches started at *at without finishing (a batch that rolled back
	// without a crash, e.g. at shutdown), or at any position when at is nil (an operator replays
	// a projection that was judged to crash the process).
	EndAttempt(ctx context.Context, p *Projection, at *eventstore.Position) error

	// Activate is the cut-over of a building version (p, the definition of a partitioned
	// one) to active, in one unit of work that holds the projection's own name's lock, the
	// active version's units' and p's units' (each set in index order): when every unit of p is
	// running or failing (not paused or rebuilding), has no parked streams and no pending dead
	// letters, and none is behind (CutOver.Behind), it runs CutOver.Run on each unit of p (which
	// brings it to the head and returns the outcome to store), points every stable name of p's
	// Config.Tables at p's tables, runs hook (if not nil), retires the active version and makes
	// p active. Each Unit it hands the runner carries the unit's building version record, with
	// ActivePartitions when the active version is partitioned. Anything failing rolls all of it
	// back. When p is not ready, it changes nothing and says why in the Activation.
	Activate(ctx context.Context, p *Projection, c CutOver, hook HookFunc) (Activation, error)
	// DropRetired runs hook (if not nil) on a retired version's unit, holding its lock, and
	// records that its read model is dropped. It returns an error matching ErrNotRetired when
	// p's version is not retired; a version already dropped is left alone.
	DropRetired(ctx context.Context, p *Projection, hook HookFunc) error
	// DropRetiredTables drops the read model of version version of p's projection, a retired
	// version whose definition (and DeleteFunc) the caller does not have: the versioned tables
	// of the stable names recorded for it. It holds that version's lock, records the drop, and
	// returns an error matching ErrNotRetired when the version is not retired; a version
	// already dropped is left alone.
	DropRetiredTables(ctx context.Context, p *Projection, version int) error

	// Seal marks the backends of this module; it does nothing.
	Seal(seal.Token)
}

// HookFunc is the runner's hook in a backend's unit of work (Register, Reset, Delete). tx is
// the unit's transaction with the PostgreSQL backend, nil with the memory backend. An error
// rolls the unit back, state change included, and is returned.
type HookFunc func(ctx context.Context, tx pgx.Tx) error

// Attempt is what StartAttempt knows about batches started at one position.
type Attempt struct {
	// Starts counts the batches started at the position without finishing, this one included.
	Starts int
	// CarefulUntil, when not zero, is the end of a range handled one event per batch because
	// the process died in a batch there.
	CarefulUntil eventstore.Position
}

// CutOver is the runner's work in Backend.Activate, on each unit of the building version (one
// per partition, in index order).
type CutOver struct {
	// Behind reports whether the unit has more events left to the head than one batch
	// (history, or events after VersionInfo.ActivePosition it has not claimed yet): the
	// cut-over then waits, so that it stays short (a partition not built yet would be built
	// under the locks); the unit's own batches get it there, claiming what the active version
	// has not handled. The backend asks every unit before it runs any.
	Behind func(ctx context.Context, unit *Projection, u Unit) (bool, error)
	// Run brings the unit to the head and returns the outcome to store.
	Run func(ctx context.Context, unit *Projection, u Unit) (Outcome, error)
}

// BatchFunc is the runner's work inside one unit.
type BatchFunc func(ctx context.Context, u Unit) (Outcome, error)

// ReadAhead is the read a batch expects to start with: the events after the position it last
// committed, with its read options. A backend may run it in the round trip that takes the
// batch's lock (PostgreSQL: one round trip fewer per batch); the unit's Read returns that
// result only when the batch asks for exactly this read — so only when the position the unit
// found is ahead's — and reads anew otherwise (another worker moved the projection meanwhile).
// It reads as a Read right after the lock would: in PostgreSQL's READ COMMITTED, each
// statement sees what committed before it started, behind the store's horizon.
type ReadAhead struct {
	After   eventstore.Position
	Options eventstore.ReadOptions
}

// Matches reports whether a read after after with opts is the read r describes.
func (r *ReadAhead) Matches(after eventstore.Position, opts eventstore.ReadOptions) bool {
	return r != nil && after == r.After && opts.Limit == r.Options.Limit && opts.OmitPayload == r.Options.OmitPayload &&
		opts.Partition == r.Options.Partition && slices.Equal(opts.Types, r.Options.Types)
}

// Unit is what a Backend hands the runner for one batch.
type Unit struct {
	// Tx is the batch's transaction (PostgreSQL), nil in memory.
	Tx pgx.Tx
	// Status is the projection's row as locked for this batch (no lag fields).
	Status Status
	// Read reads events after a position inside the unit.
	Read func(ctx context.Context, after eventstore.Position, opts eventstore.ReadOptions) ([]eventstore.Event, error)
	// ReadStream reads one stream's events after a version, in version order, inside the unit.
	ReadStream func(ctx context.Context, streamID string, afterVersion int64, limit int) ([]eventstore.Event, error)
	// Version is the unit's version record, read under the unit's lock.
	Version VersionInfo
	// Claim, for a building version's unit, tries to take the locks of the active version's
	// units that can hold the unit's streams, for the rest of the unit, waiting a bounded time
	// (under a second) for a busy one, and returns the version record read anew under them,
	// with Claiming set when it took them (see VersionInfo.Claiming); a claim that did not
	// take them all holds none. Nil when the unit cannot claim.
	Claim func(ctx context.Context) (VersionInfo, error)
	// Parked are the projection's parked streams by stream id, read under the unit's lock, so a
	// batch and a redrive (or a park, skip or purge) never interleave.
	Parked map[string]ParkedStream
}

// Outcome is what a batch stores when it commits.
type Outcome struct {
	// Position is the new committed position.
	Position eventstore.Position
	// Processed is the number of events the batch handled (added to EventsProcessed).
	Processed int
	// State is the new state.
	State State
	// ClearFailure empties the failure fields (last error, failing event, attempts, times).
	ClearFailure bool
	// Skip, when set, is an operator's skip of one event that the backend records with the
	// outcome (who, when, why).
	Skip *SkipRecord
	// Park, when set, parks a stream (its record is created with the outcome).
	Park *ParkedStream
	// Held adds, per parked stream, the events the batch passed without handling them.
	Held map[string]Held
	// Unpark removes parked streams and records the action on each.
	Unpark []Unpark
	// ParkFailed records a failed redrive on its parked stream (error, attempts).
	ParkFailed *ParkFailure
	// Statements, when not nil, are statements of the batch's handlers not sent yet: the
	// backend sends them first, in the unit's transaction (Statements.AppendTo).
	Statements *Statements
	// CommitClock, when not nil, receives the backend's clock as the unit commits: the
	// database's clock_timestamp() read in the commit's round trip, right before COMMIT. The
	// runner measures event staleness with it (BatchReport.Staleness) against the events'
	// RecordedAt, so both ends come from the store's clock. A backend that cannot read it
	// leaves it zero.
	CommitClock *time.Time
}

// ChangesParking reports whether the outcome changes parked records.
func (out Outcome) ChangesParking() bool {
	return out.Park != nil || len(out.Held) > 0 || len(out.Unpark) > 0 || out.ParkFailed != nil
}

// SkipRecord is an event an operator skipped.
type SkipRecord struct {
	Event  eventstore.EventRef
	By     string
	Reason string
	At     time.Time
	// Forced is true when the projection was not failing on the event.
	Forced bool
}

// Failure is a handler failure to record.
type Failure struct {
	// Event is the event the handler failed on.
	Event eventstore.EventRef
	// Err is the handler's error; its text becomes Status.LastError.
	Err error
	// At is when the failure happened.
	At time.Time
}
