package projection

import (
	"time"

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
	FailingEvent *eventstore.EventRef
	// Attempts counts the recorded failures on FailingEvent.
	Attempts       int
	FirstFailureAt time.Time
	LastFailureAt  time.Time

	// LastSkip is the most recent event an operator skipped; nil if none.
	LastSkip *SkipRecord

	// StateChangedBy is who last paused or resumed the projection (Runner.PauseBy and
	// ResumeBy, `nudge pause` and `nudge resume`, the console), empty when that action named
	// nobody (Runner.Pause) or nobody has paused it yet; StateChangedAt is when, zero if
	// never. Batches, failures and resets leave them, so while State is StatePaused they say
	// who paused it and since when. A partitioned projection's status has its partitions'
	// latest.
	StateChangedBy string
	StateChangedAt time.Time

	// ParkedStreams counts the projection's parked streams (Config.OnFailure = OnFailurePark);
	// OldestParkedAt is when the oldest of them was parked, zero when none is.
	ParkedStreams  int
	OldestParkedAt time.Time

	// Version is the version the status row belongs to (Config.Version; 1 for a projection
	// without versions), ActiveVersion the version readers see (0 when the backend has no
	// version record, as for rows written before versions existed) and VersionState where
	// this version stands: active, building beside the active one, or retired. A building
	// version's Progress is against the store; it cuts over once it is level with the
	// active one.
	Version       int
	ActiveVersion int
	VersionState  VersionState
	// RetiredAt is when a retired version was replaced; zero otherwise.
	RetiredAt time.Time

	// RebuildStartedAt is when the last Reset happened; zero if never.
	RebuildStartedAt time.Time
	UpdatedAt        time.Time

	// Head is the newest event the store can be read up to now (any type).
	Head eventstore.Position
	// LagEvents counts readable events of the projection's types after Position. The
	// PostgreSQL backend counts up to 1,000 of them and estimates the rest (LagEstimated), so a
	// status costs the same with any backlog.
	LagEvents int64
	// LagEstimated reports that LagEvents is an estimate: the events past the first 1,000 of
	// the projection's types are reckoned from global positions, at their density among the
	// first 1,000. Positions have gaps and the mix of types changes, so it is rough; it is exact
	// again once the backlog is below 1,000. Whether the projection lags at all is always exact.
	LagEstimated bool
	// LagTime is the age of the oldest of those events; zero when there are none.
	LagTime time.Duration
	// HeldByHorizon reports committed events of the projection's types that cannot be read yet
	// because an older transaction is still open somewhere in the database cluster: the
	// projection is waiting on that transaction, not on work. It never skips them.
	HeldByHorizon bool
	// Holder is the open transaction that holds the projection back, when HeldByHorizon is
	// true and the backend can name it (PostgreSQL); nil otherwise.
	Holder *eventstore.HorizonHolder

	// PartitionOf is, in the status of one partition of a partitioned projection, the
	// projection's unit name, and Partition the part of the log it reads; empty and the zero
	// Partition otherwise.
	PartitionOf string
	Partition   eventstore.Partition
	// Partitions are the statuses of a partitioned projection's partitions (Config.Partitions),
	// in index order; nil for a projection that is not partitioned. The fields above fold
	// them (FoldPartitions).
	Partitions []Status
	// FailingPartition names the partition unit whose failure the failure fields above show
	// (the first failing partition), empty when none fails or the projection is not partitioned.
	FailingPartition string
}

// stateRank orders states for FoldPartitions: the worst state of any partition is the
// projection's.
var stateRank = map[State]int{StateRunning: 0, StateRebuilding: 1, StatePaused: 2, StateFailing: 3}

// FoldPartitions folds the statuses of a partitioned projection's partitions, in index order,
// into the projection's status, named name: the worst state (failing, then paused, then
// rebuilding, then running); the lowest position (positions of different partitions are not
// comparable otherwise: it says only how far the slowest partition is); counters, lag and
// parked streams summed; the oldest lag, the newest head, update, skip and pause or resume
// (StateChangedBy and StateChangedAt); held when any
// partition is held; the failure of the first failing partition, named in FailingPartition.
// The partitions stay in Partitions.
func FoldPartitions(name string, parts []Status) Status {
	if len(parts) == 0 {
		return Status{Name: name}
	}
	f := Status{Name: name, State: StateRunning, Position: parts[0].Position, Partitions: parts,
		Version: parts[0].Version, ActiveVersion: parts[0].ActiveVersion, VersionState: parts[0].VersionState, RetiredAt: parts[0].RetiredAt}
	for _, st := range parts {
		f.foldState(st)
		f.foldCounts(st)
		f.foldTimes(st)
	}
	return f
}

// foldState folds a partition's state, position and failure into f.
func (f *Status) foldState(st Status) {
	if stateRank[st.State] > stateRank[f.State] {
		f.State = st.State
	}
	if st.Position.Less(f.Position) {
		f.Position = st.Position
	}
	if st.State == StateFailing && f.FailingPartition == "" {
		f.FailingPartition, f.LastError, f.FailingEvent, f.Attempts = st.Name, st.LastError, st.FailingEvent, st.Attempts
		f.FirstFailureAt, f.LastFailureAt = st.FirstFailureAt, st.LastFailureAt
	}
	if st.HeldByHorizon && !f.HeldByHorizon {
		f.HeldByHorizon, f.Holder = true, st.Holder
	}
}

// foldCounts sums a partition's counters and lag into f.
func (f *Status) foldCounts(st Status) {
	f.EventsProcessed += st.EventsProcessed
	f.LagEvents += st.LagEvents
	f.LagEstimated = f.LagEstimated || st.LagEstimated
	f.LagTime = max(f.LagTime, st.LagTime)
	f.ParkedStreams += st.ParkedStreams
	if f.Head.Less(st.Head) {
		f.Head = st.Head
	}
}

// foldTimes keeps the oldest parked stream and the newest skip, pause or resume, rebuild and
// update of f and a partition.
func (f *Status) foldTimes(st Status) {
	if !st.OldestParkedAt.IsZero() && (f.OldestParkedAt.IsZero() || st.OldestParkedAt.Before(f.OldestParkedAt)) {
		f.OldestParkedAt = st.OldestParkedAt
	}
	if st.LastSkip != nil && (f.LastSkip == nil || st.LastSkip.At.After(f.LastSkip.At)) {
		f.LastSkip = st.LastSkip
	}
	if st.StateChangedAt.After(f.StateChangedAt) {
		f.StateChangedBy, f.StateChangedAt = st.StateChangedBy, st.StateChangedAt
	}
	if st.RebuildStartedAt.After(f.RebuildStartedAt) {
		f.RebuildStartedAt = st.RebuildStartedAt
	}
	if st.UpdatedAt.After(f.UpdatedAt) {
		f.UpdatedAt = st.UpdatedAt
	}
}

// CaughtUp reports whether the projection has nothing readable left to do. It may still fail,
// be paused or wait on the horizon: Condition() == ConditionCaughtUp says none of those.
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

// Condition is the one word for where a projection stands now, derived from its stored State,
// its lag and the store's horizon. Status.Condition, the SQL view nudge_projection_conditions
// (projection/postgres), `nudge status` and the metric projection_condition all give the same.
type Condition string

const (
	// ConditionCaughtUp: nothing readable is left to handle and nothing waits.
	ConditionCaughtUp Condition = "caught_up"
	// ConditionWorking: readable events of the projection's types wait to be handled.
	ConditionWorking Condition = "working"
	// ConditionHeld: every readable event is handled, but committed events of its types wait
	// behind an open transaction (Status.Holder names it); the projection waits, never skips.
	ConditionHeld Condition = "held"
	// ConditionFailing: a handler fails on Status.FailingEvent; the position stops before it.
	ConditionFailing Condition = "failing"
	// ConditionPaused: an operator paused the projection.
	ConditionPaused Condition = "paused"
	// ConditionRebuilding: a reset sent the projection back to the start; it is catching up.
	ConditionRebuilding Condition = "rebuilding"
	// ConditionRetired: a newer version of the projection replaced this one (Config.Version):
	// readers see the newer one, and this version's batches do nothing, however far behind it
	// is.
	ConditionRetired Condition = "retired"
)

// Conditions lists every condition.
func Conditions() []Condition {
	return []Condition{ConditionCaughtUp, ConditionWorking, ConditionHeld, ConditionFailing, ConditionPaused, ConditionRebuilding, ConditionRetired}
}

// Condition returns the projection's one condition: retired for a version a newer one
// replaced; paused, failing and rebuilding come from the stored state; a running projection is
// working while it lags, held while only events behind the horizon wait, else caught up.
func (s Status) Condition() Condition {
	switch {
	case s.VersionState == VersionRetired:
		return ConditionRetired
	case s.State == StatePaused:
		return ConditionPaused
	case s.State == StateFailing:
		return ConditionFailing
	case s.State == StateRebuilding:
		return ConditionRebuilding
	case s.LagEvents > 0:
		return ConditionWorking
	case s.HeldByHorizon:
		return ConditionHeld
	default:
		return ConditionCaughtUp
	}
}
