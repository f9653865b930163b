// Package deadletter is nudge's durable, queryable store of poisoned triggers: triggers a
// projection could not handle after its retries, or that could never succeed (a trigger that
// does not decode).
//
// A worker writes an Entry with Store.Add when it gives up on a trigger, and acks the trigger
// only after that write succeeded. Operators then list and inspect the records, replay them
// once the cause is fixed (Replay), resolve them, and purge old ones. The Store interface has
// two backends with one contract, checked by the deadletter/deadlettertest suite:
// deadletter/postgres (the table nudge_dead_letters, readable with plain SQL) and
// deadletter/memory.
//
// # Folding
//
// A projection stuck on one event dead-letters every trigger it gets until the event is fixed
// or skipped. Those entries fold into one record instead of piling up: an entry for the same
// projection and the same failing event (FailingEvent.ID) as a record that is not resolved
// updates that record — Count grows by one, Attempts by the entry's attempts, LastFailedAt,
// Error, MessageUUID, Payload and Metadata become the entry's, and a replayed record returns
// to failed. An entry without a failing event (the trigger itself was invalid) folds by
// projection and message UUID instead, so a redelivered bad message does not pile up either.
// A resolved record never folds: the next entry for its event starts a new record.
//
// # Statuses
//
//	failed ──Replay──► replayed ──fails again──► failed
//	   │                  │
//	   └─Resolve/healed───┴──► resolved ──Purge──► (gone)
//
// # Healed records
//
// A projection that failed on a transient cause (a lock or statement timeout, a serialization
// failure, a database restart) is dead-lettered when its retries run out, and then often passes
// the event by itself at its next trigger. Such a record would only be replayed for nothing, so
// the worker marks such an entry (Metadata key MetadataTransient, naming the cause) and resolves
// the record (Store.ResolvePassed) once the projection's committed position has passed its
// failing event while the record is still failed: status resolved, ResolvedBy HealedBy, and a
// note naming the position passed and when (Record.Healed reports it). Records of other causes
// (a bug fixed by a deploy is the operator's to replay), records without a failing event (an
// invalid trigger) and replayed records are never healed.
//
// Purge deletes resolved records by default; with PurgeOptions.IncludeUnresolved it deletes
// old records in any status.
package deadletter

import (
	"context"
	"time"

	"github.com/nudgeworks/nudge/eventstore"
)

// Defaults and limits.
const (
	// ListLimitDefault is the page size of Store.List when Filter.Limit is 0.
	ListLimitDefault = 100
	// ListLimitMax is the largest Filter.Limit.
	ListLimitMax = 10_000
	// ReplayPageSizeDefault is how many records Replay reads and marks at a time when
	// ReplayFilter.PageSize is 0.
	ReplayPageSizeDefault = 500
	// ErrorMaxBytes is the longest Error kept; a longer one is cut and ends in "…".
	ErrorMaxBytes = 4096
	// HealedBy is the ResolvedBy of a record resolved by Store.ResolvePassed: its projection
	// passed the failing event by itself.
	HealedBy = "nudge (healed)"
	// MetadataTransient is the Entry.Metadata key that marks a failure on a transient cause
	// (its value names the cause, e.g. a SQLSTATE): only such records are healed by
	// Store.ResolvePassed.
	MetadataTransient = "nudge_transient_cause"
)

// Entry is one dead-lettered delivery of a trigger, as a worker writes it.
type Entry struct {
	// Projection is the projection the trigger was delivered to. Required; a valid projection
	// name (see name.Validate).
	Projection string
	// MessageUUID is the broker message's UUID. Entries without a FailingEvent fold by it.
	MessageUUID string
	// Payload is the trigger as received; it may be any bytes (an invalid trigger's, say) and is
	// kept byte for byte.
	Payload []byte
	// Metadata is the message's metadata.
	Metadata map[string]string
	// Error says why the trigger was dead-lettered. Text longer than ErrorMaxBytes is cut.
	Error string
	// FailingEvent is the event the projection failed on; nil when the trigger itself was
	// invalid. Its ID must be set; entries fold by it.
	FailingEvent *eventstore.EventRef
	// Attempts is how often this delivery was tried. Defaults to 1.
	Attempts int
	// At is when the delivery was given up. Defaults to the time of the Add.
	At time.Time
}

// Record is a stored dead letter: one or more folded entries and what operators did about them.
//
// Text fields hold valid UTF-8 without NUL bytes (anything else is replaced when the entry is
// added), and times are in UTC with microsecond precision, as PostgreSQL keeps them.
type Record struct {
	// ID identifies the record; later records have larger IDs.
	ID int64
	// Projection is the projection the triggers were for.
	Projection string
	// MessageUUID is the broker message UUID of the latest folded entry.
	MessageUUID string
	// Payload is the latest folded trigger as received; nil when empty.
	Payload []byte
	// Metadata is the latest folded trigger's message metadata; nil when empty.
	Metadata map[string]string
	// Error is the latest entry's error.
	Error string
	// FailingEvent is the event the projection failed on; nil for an invalid trigger.
	FailingEvent *eventstore.EventRef
	// Attempts is the sum of the folded entries' attempts.
	Attempts int
	// Count is how many entries (deliveries) folded into this record.
	Count int
	// FirstFailedAt is the earliest Entry.At folded in.
	FirstFailedAt time.Time
	// LastFailedAt is the latest Entry.At folded in; Purge goes by it.
	LastFailedAt time.Time
	// Status is where the record stands.
	Status Status
	// ReplayedBy is who replayed the record last; empty if never.
	ReplayedBy string
	// ReplayedAt is when the record was replayed last; zero if never.
	ReplayedAt time.Time
	// Replays counts the replays of the record.
	Replays int
	// ResolvedBy is who resolved the record; empty while it is not resolved.
	ResolvedBy string
	// ResolvedAt is when the record was resolved.
	ResolvedAt time.Time
	// ResolveNote is the operator's note on the resolution.
	ResolveNote string
	// UpdatedAt is the store's clock at the record's last change.
	UpdatedAt time.Time
}

// Healed reports whether the record was resolved because its projection passed the failing
// event by itself (Store.ResolvePassed), rather than by an operator.
func (r Record) Healed() bool { return r.Status == StatusResolved && r.ResolvedBy == HealedBy }

// Filter selects records for Store.List.
type Filter struct {
	// Projection, if set, selects that projection's records only: its own and those of its
	// partitions (a partitioned projection's partitions dead-letter under their unit names,
	// "<projection>.pNN").
	Projection string
	// Status, if set, selects records in one of these statuses.
	Status []Status
	// Limit is the most records returned. Defaults to ListLimitDefault; at most ListLimitMax.
	Limit int
	// AfterID selects records with a larger ID: pass the last ID of a page to get the next.
	AfterID int64
}

// PurgeOptions selects the records Store.Purge deletes.
type PurgeOptions struct {
	// OlderThan selects records whose LastFailedAt is before Now minus OlderThan. 0 selects
	// every record up to Now.
	OlderThan time.Duration
	// IncludeUnresolved also deletes failed and replayed records; by default only resolved
	// records are deleted.
	IncludeUnresolved bool
	// Now is the time OlderThan counts back from. Defaults to the time of the call.
	Now time.Time
}

// Store keeps dead letters. Implementations are safe for concurrent use and pass the
// deadletter/deadlettertest suite.
type Store interface {
	// Add writes an entry, folding it into the record that is open for the same projection and
	// failing event (or message UUID); see the package documentation. It returns the record as
	// stored after the write. The entry is checked (a valid projection name, a failing event
	// with an id, attempts not negative) and cleaned as Record describes: Attempts defaults to 1
	// and At to now, text is made valid UTF-8 without NUL bytes, Error is cut to ErrorMaxBytes.
	// A refused entry (an error matching ErrInvalidInput) writes nothing.
	Add(ctx context.Context, e Entry) (Record, error)
	// Get returns the record with the given ID, or an error matching ErrNotFound.
	Get(ctx context.Context, id int64) (Record, error)
	// List returns the records f selects, by ascending ID.
	List(ctx context.Context, f Filter) ([]Record, error)
	// MarkReplayed sets the named records that are failed or replayed to replayed, records by
	// and at as the last replay and counts it; other records and unknown IDs are left alone.
	// It returns how many records it changed. by must name who replays.
	MarkReplayed(ctx context.Context, ids []int64, by string, at time.Time) (int, error)
	// Resolve closes a record: status resolved, with by, note and at. Resolving a resolved
	// record changes nothing (the first resolution stays). An unknown id is an error matching
	// ErrNotFound. by must name who resolves.
	Resolve(ctx context.Context, id int64, by, note string, at time.Time) error
	// ResolvePassed resolves, as healed, the projection's failed records that are marked
	// transient (Metadata holds MetadataTransient) and whose failing event is at or before
	// passed, the projection's committed position: the projection has handled that event
	// since, so the fault healed by itself and a replay would do nothing. Each such record
	// gets status resolved, ResolvedBy HealedBy, ResolvedAt at (the time of the call when zero)
	// and the ResolveNote "healed: projection passed position <passed> at <at>". Records
	// without a failing event (invalid triggers), records of later events, and replayed and
	// resolved records are left alone (a replayed record already says what happened to it). It
	// returns how many records it resolved.
	ResolvePassed(ctx context.Context, projection string, passed eventstore.Position, at time.Time) (int, error)
	// Purge deletes the records opts selects (by default resolved records whose LastFailedAt
	// is older than opts.OlderThan) and returns how many.
	Purge(ctx context.Context, opts PurgeOptions) (int, error)
}
