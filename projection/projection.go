package projection

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/storecheck"
)

// Defaults for Config.
const (
	// BatchSizeDefault is the most events one batch (one transaction) handles.
	BatchSizeDefault = 500
	// MaxBatchDurationDefault bounds how long a batch handles events before it commits what it
	// has, to keep transactions short: an open batch holds its read model's row locks (and, with
	// Config.AppendsEvents, every reader of the store).
	MaxBatchDurationDefault = 2 * time.Second
	// BatchTimeoutDefault bounds one batch's unit of work, from its start to its commit.
	BatchTimeoutDefault = time.Minute
	// CrashLoopLimitSuggested is a good Config.CrashLoopLimit: how many batches may start at
	// one position without finishing (the process died in them) before the runner hunts for the
	// event that kills it.
	CrashLoopLimitSuggested = 3
)

// Config tunes a projection. Every field is optional.
type Config struct {
	// BatchSize is the most events one batch handles in one transaction. Defaults to
	// BatchSizeDefault; at most eventstore.ReadLimitMax.
	BatchSize int
	// MaxBatchDuration ends a batch early (committing what it handled) once handling has taken
	// this long. Defaults to MaxBatchDurationDefault.
	MaxBatchDuration time.Duration
	// BatchTimeout bounds one batch's unit of work — the database's connection, read, handlers,
	// flush hook and commit — and the write that records a failure. When it passes, the batch's
	// context ends: the batch rolls back and CatchUp returns an error matching ErrBatchTimeout,
	// which is not a handler failure (nothing is recorded or dead-lettered; a worker nacks the
	// trigger, which comes back). A new version's cut-over is bounded the same way: one past it
	// rolls back whole and returns an error matching ErrBatchTimeout and context.DeadlineExceeded.
	// It is what stops a catch-up from waiting forever on a database that stalls (a partition) or
	// on a lock. It must exceed MaxBatchDuration. Defaults to BatchTimeoutDefault, or to twice
	// MaxBatchDuration when that is longer.
	BatchTimeout time.Duration
	// CrashLoopLimit is how many times batches may start at one position without finishing —
	// the process died during them, where no recover or retry can see it — before the runner
	// handles that range one event per batch and, when the process dies CrashLoopLimit times
	// more on one event, records that event as poison (a *CrashLoopError) instead of handling it
	// again. Each batch with events records its start in a transaction of its own to count this;
	// with the PostgreSQL backend that takes a second connection while the batch holds one, so
	// give the pool more connections than projections catching up at once (a start that cannot
	// get one within a second goes uncounted). 0, the default, turns the detection off;
	// CrashLoopLimitSuggested is a good value.
	CrashLoopLimit int
	// OmitPayloads reads events without their payload and metadata, which saves the store work
	// for projections that need only positions, types and streams (the trigger relay). Only
	// OnAnyIdempotent handlers may be used with it: typed handlers need the payload.
	OmitPayloads bool
	// AppendsEvents declares that handlers or hooks append events to the event store in the
	// batch's transaction (a process manager, say). Without it the PostgreSQL backend exempts
	// every batch from the store's read horizon, so a slow batch does not hold back other
	// projections' reads, and an append in the batch's transaction fails with
	// postgres.ErrExempt. With it, each batch holds back every reader of the store from its
	// first write to its commit, like any writing transaction.
	AppendsEvents bool
	// SynchronousCommit makes each batch wait, at its commit, until the commit is on disk.
	// Without it the PostgreSQL backend commits the batches of a projection that does not
	// append events with synchronous_commit = off: the commit is visible at once and reaches
	// disk within about three times the server's wal_writer_delay, and the batch skips the WAL
	// flush that is most of what a small batch costs the server. A server crash in that window
	// loses the batches' read-model writes and their positions together, so the projection
	// reads those events again (exactly once still, from its committed position) at its next
	// trigger, safety-net tick or start; a trigger already acknowledged for them is not
	// needed. Set it when something outside the database acts on a batch's commit and must
	// not see it undone. A projection with AppendsEvents always commits synchronously: the
	// events it appends may leave the database (a relay, a broker) at once. The in-memory
	// backend ignores it.
	SynchronousCommit bool

	// OnFailure says what the projection does once a handler keeps failing on an event:
	// OnFailureStop (stop before it) or OnFailurePark (park its stream and go on). Defaults to
	// OnFailureStop. See OnFailurePark for the semantics and docs/guides/parking.md for when to use it.
	OnFailure OnFailure
	// MaxParkedStreams bounds the projection's parked streams: past it the projection stops on
	// the next failing event instead of parking its stream. Defaults to MaxParkedStreamsDefault.
	MaxParkedStreams int
	// ParkAfterAttempts is how many recorded failures on one event park its stream (with
	// OnFailurePark). A permanent error (retry.Permanent, a payload that does not decode) and
	// a crash-loop verdict park at once. Keep it at most the worker's Retry.MaxAttempts, so the
	// stream parks before the trigger is dead-lettered. Defaults to ParkAfterAttemptsDefault.
	ParkAfterAttempts int

	// InitFunc creates what the read model needs (tables, indexes). It runs when the runner
	// starts (Runner.Init), every time, so it must be idempotent (CREATE TABLE IF NOT EXISTS).
	InitFunc func(ctx context.Context, p HookParams) error
	// FlushFunc runs after each batch's handlers, inside the batch's transaction, before the
	// position is committed: the place for set-based writes of what the handlers collected.
	FlushFunc func(ctx context.Context, p FlushParams) error
	// ResetFunc empties the read model for a rebuild (Runner.Reset), in the transaction that
	// sets the position back to the start.
	ResetFunc func(ctx context.Context, p HookParams) error
	// DeleteFunc removes the read model when the projection is deleted (Runner.Delete).
	DeleteFunc func(ctx context.Context, p HookParams) error
	// SkipFunc runs when an operator skips an event the projection failed on, inside the
	// transaction that moves the position past it.
	SkipFunc func(ctx context.Context, p SkipParams) error

	// Version is the version of the projection's read model. Deploying a definition with a
	// higher version than the active one builds it beside the active version, as a unit of its
	// own (UnitName), and cuts readers over to it atomically once it has caught up (see
	// docs/guides/changing-shape.md). Defaults to 1.
	Version int
	// Tables are the stable names of the read model's tables. Hooks and handlers write to
	// Projection.Table(name), the version's own table (name_vN); readers query name, a view
	// of the active version's table, which the cut-over replaces in its transaction. Leave it
	// empty for a projection that names its tables itself. A version above 1 that lists a
	// name still held by version 1's plain table adopts it when it registers: the table is
	// renamed name_v1 and name becomes a view of it (see docs/guides/changing-shape.md).
	Tables []string
	// ActivateFunc runs in the cut-over's transaction, after the views point at this version
	// and before the commit: an error cancels the cut-over (nothing changes). Grant privileges
	// on the new tables here, say.
	ActivateFunc func(ctx context.Context, p HookParams) error
	// RetireGrace is how long this version's read model is kept once a newer version has
	// replaced it, before DeleteFunc drops it (run by a runner holding this version's
	// definition, at its next catch-up; without a DeleteFunc, the versioned tables of its
	// Tables, or of the tables a newer version adopted from it, are dropped). A retired version
	// whose definition no runner has any more is dropped that way by the active version's
	// runner, after the active version's RetireGrace. A negative value keeps it until
	// Runner.DropRetired. Defaults to RetireGraceDefault.
	RetireGrace time.Duration
	// Partitions splits the projection into this many partitions by stream (see
	// eventstore.PartitionOf): each partition is a unit of its own (Projection.Units, named by
	// PartitionUnitName), with its own position, status row, batch lock and failure, and reads
	// only its streams' events, so every stream's events are still handled in order and
	// partitions catch up independently (Runner.CatchUpPartition), in any process. A failing
	// partition stops alone. A registered projection refuses another count
	// (*PartitionCountError): change it with a new Version, which is built beside the active
	// one with its own partitions and cuts over once level (versions and partition counts
	// combine freely, in both directions). At most eventstore.MaxPartitions. Defaults to 1: one unit named like the projection, as without
	// partitions.
	Partitions int
	// BuildLagTarget paces this version while it is built beside the active one: while the
	// active version runs with a lag (the age of the oldest event it has not handled yet) over
	// BuildLagTarget, the build waits between its batches, longer each time the lag stays over
	// it and shorter each time it is under (see docs/guides/changing-shape.md),
	// and while the active version takes live events the build's batches are sized to take
	// about half the target each (at least 10 events, at most BatchSize), so a live event
	// never queues behind a long one. While the live projection lags over the target on
	// about one batch in ten, the build runs about 11 % of the time; with nothing to do live,
	// at full speed in whole batches. A failing, paused or
	// stopped active version does not hold the build back, and a build that did not gain on
	// the active version over 5 s (closed less of its distance to it than the active version
	// moved: it ran less than twice as fast as the live events arrived) halves the bound on
	// its waits for the next 5 s, down to none (whole batches, no waits), doubling it back once
	// it gains, so it ends however loaded the machine. Defaults to
	// BuildLagTargetDefault (5 ms); a higher target trades live latency for a faster build,
	// and a negative value builds at full speed.
	BuildLagTarget time.Duration
}

// HookParams is passed to the init, reset and delete hooks.
type HookParams struct {
	Projection string
	// Tx is the hook's transaction with the PostgreSQL backend; nil with the memory backend.
	Tx pgx.Tx
}

// FlushParams is passed to the flush hook.
type FlushParams struct {
	Projection string
	// Tx is the batch's transaction with the PostgreSQL backend; nil with the memory backend.
	Tx pgx.Tx
	// Events are the events the batch handled, in order.
	Events []eventstore.Event
}

// SkipParams is passed to the on-skip hook.
type SkipParams struct {
	Projection string
	Tx         pgx.Tx
	// Event is the event being skipped.
	Event eventstore.Event
	// Reason and By are what the operator gave.
	Reason string
	By     string
}

// Projection is a validated projection definition. Create it with New; it is immutable and safe
// to share.
type Projection struct {
	name          string // the unit name (UnitName)
	base          string // the name New was given, shared by every version
	cfg           Config
	handlers      map[string]Handler
	types         []string // nil: every type
	anyHandler    *Handler
	transactional bool

	// parts are the partition units of a partitioned projection (Config.Partitions > 1);
	// partition is a partition unit's part of the log and parent its definition.
	parts     []*Projection
	partition eventstore.Partition
	parent    *Projection
}

// New defines a projection named name that handles events with handlers, one handler per event
// type. Events of other types are never read: the type filter runs in the event store's query.
// An invalid name is refused with a *name.Error (matching name.ErrInvalid; see name.Validate),
// and so is a name starting with name.ReservedPrefix, which is nudge's own (the relay's).
func New(name string, cfg Config, handlers ...Handler) (*Projection, error) {
	if err := refuseReserved(name); err != nil {
		return nil, err
	}
	return newProjection(name, cfg, handlers...)
}

// newProjection is New without the check for reserved names.
func newProjection(name string, cfg Config, handlers ...Handler) (*Projection, error) {
	if err := validateName(name); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("projection %s: %w", name, err)
	}
	if err := validateTables(name, cfg.Version, cfg.Tables); err != nil {
		return nil, err
	}
	unit, err := UnitName(name, cfg.Version)
	if err != nil {
		return nil, err
	}
	if len(handlers) == 0 {
		return nil, invalidConfig(name, "no handlers; pass at least one projection.On or projection.OnIdempotent")
	}
	p := &Projection{name: unit, base: name, cfg: cfg, handlers: make(map[string]Handler, len(handlers))}
	for i := range handlers {
		if err := p.add(handlers, i); err != nil {
			return nil, err
		}
	}
	slices.Sort(p.types)
	if cfg.OmitPayloads && len(p.types) > 0 {
		return nil, invalidConfig(name, "OmitPayloads needs OnAnyIdempotent handlers only: typed handlers decode the payload")
	}
	if p.anyHandler != nil {
		p.types = nil // read every event
	}
	if err := p.split(); err != nil {
		return nil, err
	}
	return p, nil
}

// WithDefaults returns cfg with every zero field that has a default set to it.
func (cfg Config) WithDefaults() Config {
	cfg.BatchSize = cmp.Or(cfg.BatchSize, BatchSizeDefault)
	cfg.MaxBatchDuration = cmp.Or(cfg.MaxBatchDuration, MaxBatchDurationDefault)
	cfg.OnFailure = cmp.Or(cfg.OnFailure, OnFailureStop)
	cfg.MaxParkedStreams = cmp.Or(cfg.MaxParkedStreams, MaxParkedStreamsDefault)
	cfg.ParkAfterAttempts = cmp.Or(cfg.ParkAfterAttempts, ParkAfterAttemptsDefault)
	cfg.Version = cmp.Or(cfg.Version, 1)
	cfg.Partitions = cmp.Or(cfg.Partitions, 1)
	cfg.RetireGrace = cmp.Or(cfg.RetireGrace, RetireGraceDefault)
	cfg.BuildLagTarget = cmp.Or(cfg.BuildLagTarget, BuildLagTargetDefault)
	if cfg.BatchTimeout == 0 {
		cfg.BatchTimeout = max(BatchTimeoutDefault, 2*cfg.MaxBatchDuration)
	}
	return cfg
}

// Validate reports what is wrong with cfg (after WithDefaults), as an error matching
// ErrInvalidConfig.
func (cfg Config) Validate() error {
	if cfg.BatchSize < 1 || cfg.BatchSize > eventstore.ReadLimitMax {
		return fmt.Errorf("%w: BatchSize %d out of range; use 1 to %d (0 means %d)",
			ErrInvalidConfig, cfg.BatchSize, eventstore.ReadLimitMax, BatchSizeDefault)
	}
	if cfg.CrashLoopLimit < 0 {
		return fmt.Errorf("%w: CrashLoopLimit %d is negative; 0 turns crash-loop detection off", ErrInvalidConfig, cfg.CrashLoopLimit)
	}
	if cfg.MaxBatchDuration < 0 {
		return fmt.Errorf("%w: MaxBatchDuration %s is negative (0 means %s)", ErrInvalidConfig, cfg.MaxBatchDuration, MaxBatchDurationDefault)
	}
	if !slices.Contains(OnFailures(), cfg.OnFailure) {
		return fmt.Errorf("%w: OnFailure %q; use one of %q", ErrInvalidConfig, cfg.OnFailure, OnFailures())
	}
	if cfg.MaxParkedStreams < 1 || cfg.ParkAfterAttempts < 1 {
		return fmt.Errorf("%w: MaxParkedStreams (%d) and ParkAfterAttempts (%d) must be positive (0 means %d and %d)",
			ErrInvalidConfig, cfg.MaxParkedStreams, cfg.ParkAfterAttempts, MaxParkedStreamsDefault, ParkAfterAttemptsDefault)
	}
	if cfg.Version < 1 {
		return fmt.Errorf("%w: Version %d; versions start at 1 (0 means 1)", ErrInvalidConfig, cfg.Version)
	}
	if cfg.Partitions < 1 || cfg.Partitions > eventstore.MaxPartitions {
		return fmt.Errorf("%w: Partitions %d out of range; use 1 to %d (0 means 1)", ErrInvalidConfig, cfg.Partitions, eventstore.MaxPartitions)
	}
	if cfg.BatchTimeout <= cfg.MaxBatchDuration {
		return fmt.Errorf("%w: BatchTimeout %s must exceed MaxBatchDuration %s (a batch that handles events that long still has to commit)",
			ErrInvalidConfig, cfg.BatchTimeout, cfg.MaxBatchDuration)
	}
	return nil
}

// add adds handlers[i] to the projection: the handler for its event type, or for any type.
func (p *Projection) add(handlers []Handler, i int) error {
	h := handlers[i]
	if h.eventType == anyType {
		if h.handle == nil {
			return invalidConfig(p.name, "handler %d (any type) has a nil function", i)
		}
		if p.anyHandler != nil {
			return invalidConfig(p.name, "two handlers for any event type; combine them into one")
		}
		p.anyHandler = &handlers[i]
		return nil
	}
	if err := storecheck.EventType(h.eventType); err != nil {
		return invalidConfig(p.name, "handler %d: event type: %v", i, err)
	}
	if h.handle == nil {
		return invalidConfig(p.name, "handler %d for %s has a nil function", i, h.eventType)
	}
	if _, dup := p.handlers[h.eventType]; dup {
		return invalidConfig(p.name, "two handlers for event type %s; combine them into one", h.eventType)
	}
	p.handlers[h.eventType] = h
	p.types = append(p.types, h.eventType)
	p.transactional = p.transactional || h.transactional
	return nil
}

// Name returns the projection's unit name: the name New was given for version 1, else
// UnitName's "<name>.v<version>". Positions, status, locks, dead letters and trigger
// subscriptions are keyed by it.
func (p *Projection) Name() string { return p.name }

// Types returns the event types the projection handles, sorted; nil when it handles every type
// (it has an OnAnyIdempotent handler).
func (p *Projection) Types() []string { return slices.Clone(p.types) }

// Config returns the projection's configuration with defaults filled in.
func (p *Projection) Config() Config { return p.cfg }

// Transactional reports whether any handler needs the batch's PostgreSQL transaction (On).
func (p *Projection) Transactional() bool { return p.transactional }

// Handle decodes e and runs the projection's handler for its type, with tx as the
// transaction (nil for OnIdempotent-only projections outside PostgreSQL). An event of a type
// the projection does not handle is ignored. A failure is returned as a *HandlerError.
func (p *Projection) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	h, ok := p.handlers[e.Type]
	if !ok {
		if p.anyHandler == nil {
			return nil
		}
		h = *p.anyHandler
	}
	if err := h.handle(ctx, tx, e); err != nil {
		return p.handlerError(e, err)
	}
	return nil
}

// handleInBatch runs the handler for events[i] in a runner's batch: an OnQueued handler queues
// its statements on q; any other handler first sends what earlier events queued, so it sees
// their writes.
func (p *Projection) handleInBatch(ctx context.Context, tx pgx.Tx, q *Queue, events []eventstore.Event, i int) error {
	e := events[i]
	h, ok := p.handlers[e.Type]
	if !ok {
		if p.anyHandler == nil {
			return nil
		}
		h = *p.anyHandler
	}
	if h.queued != nil {
		q.event = i
		if err := h.queued(ctx, q, e); err != nil {
			return p.handlerError(e, err)
		}
		return nil
	}
	if err := p.sendQueue(ctx, tx, q, events); err != nil {
		return err
	}
	if err := h.handle(ctx, tx, e); err != nil {
		return p.handlerError(e, err)
	}
	return nil
}

// sendQueue sends the statements queued on q; a failure is charged to the event that queued
// the failing statement.
func (p *Projection) sendQueue(ctx context.Context, tx pgx.Tx, q *Queue, events []eventstore.Event) error {
	if owner, err := q.send(ctx, tx); err != nil {
		return p.handlerError(events[owner], err)
	}
	return nil
}

func (p *Projection) handlerError(e eventstore.Event, err error) *HandlerError {
	return &HandlerError{Projection: p.name, Event: e.Ref(), Err: err}
}
