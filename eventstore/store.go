// Package eventstore defines nudge's event store: the event and position types, the errors a
// store returns and the Store interface that projections read from.
//
// Two implementations keep the same contract, checked by the shared suite in
// eventstore/storetest: eventstore/postgres (PostgreSQL through pgx/v5, the source of truth in
// production) and eventstore/memory (for the embedded demo and fast tests).
//
// The contract:
//   - Append writes events to one stream, checks an ExpectedVersion, and is atomic: all of the
//     events or none.
//   - Appending events whose IDs are already stored never creates a second row: an exact
//     repeat of an earlier append succeeds without writing (AppendResult.Idempotent), anything
//     else fails with ErrDuplicateEvent.
//   - Read returns events in Position order and never skips one: once Read has returned events
//     up to position P, no event can later appear before P, however transactions interleave.
//   - Within a stream, Read returns events in version order.
//   - A partitioned Read (ReadOptions.Partition) returns the events of the streams of one
//     partition (PartitionOf), in the same order and under the same never-skip rule.
//   - An append beyond the store's Limits (1 MiB per event, 16 MiB and 10,000 events per append
//     by default) is refused with ErrTooLarge before anything reaches the database.
//
// Backends share their input checks (internal/storecheck), so both refuse the same calls with
// the same errors.
package eventstore

import (
	"context"
)

// Limits on append input.
const (
	// MaxStreamIDLength is the longest stream id accepted, in bytes.
	MaxStreamIDLength = 255
	// MaxTypeLength is the longest event type accepted, in bytes.
	MaxTypeLength = 255
	// ReadLimitDefault is the page size Read uses when ReadOptions.Limit is zero.
	ReadLimitDefault = 500
	// ReadLimitMax is the largest page Read accepts.
	ReadLimitMax = 10_000
)

// ReadOptions narrows a Read.
type ReadOptions struct {
	// Limit is the most events to return. Defaults to ReadLimitDefault; at most ReadLimitMax.
	Limit int
	// Types, when not empty, returns only events of these types, each event once (a type named
	// twice counts once); the filter runs in the store, so events of other types never reach
	// the caller.
	Types []string
	// OmitPayload returns the events without Payload and Metadata (both nil), for readers that
	// need only positions, types and streams.
	OmitPayload bool
	// Partition, when partitioned (Count above 1), returns only the events of the streams in
	// that partition, in read order; the zero value reads the whole log. A read of partition i
	// of N after position P returns exactly the events of the whole log's read after P whose
	// stream is in partition i, and never skips one either. The PostgreSQL store reads a
	// partition through an index made by Store.EnsurePartitions(ctx, N), without visiting the
	// other partitions' events; without that index the read is correct but scans them.
	Partition Partition
}

// Store is an event store. Both implementations in this module are safe for concurrent use.
type Store interface {
	// Append appends events to the stream streamID if the stream satisfies expected. It
	// retries internal ErrConflict races itself. Input that breaks the store's rules (an
	// empty type, a payload that is not JSON, …: ErrInvalidInput) or its Limits (ErrTooLarge)
	// is refused before anything is written.
	Append(ctx context.Context, streamID string, expected ExpectedVersion, events ...EventData) (AppendResult, error)
	// Read returns up to opts.Limit events after the position after, in read order. An empty
	// result means there is nothing more to read now.
	Read(ctx context.Context, after Position, opts ReadOptions) ([]Event, error)
	// ReadStream returns up to limit events of one stream with a version above afterVersion, in
	// version order. A stream with no events reads as empty, not as an error. A limit of 0 means
	// ReadLimitDefault.
	ReadStream(ctx context.Context, streamID string, afterVersion int64, limit int) ([]Event, error)
	// Head returns the position of the newest event Read can return now (the zero Position for
	// an empty store).
	Head(ctx context.Context) (Position, error)
}
