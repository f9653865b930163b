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
package eventstore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
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
	// Types, when not empty, returns only events of these types; the filter runs in the store,
	// so events of other types are never fetched.
	Types []string
	// OmitPayload returns the events without Payload and Metadata (both nil), for readers that
	// need only positions, types and streams.
	OmitPayload bool
}

// Store is an event store. Both implementations in this module are safe for concurrent use.
type Store interface {
	// Append appends events to the stream streamID if the stream satisfies expected. It
	// retries internal ErrConflict races itself.
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

// ValidateAppend checks an append's arguments as every store does, before anything is written.
func ValidateAppend(streamID string, expected ExpectedVersion, events []EventData) error {
	if err := validateName("StreamID", -1, streamID, MaxStreamIDLength); err != nil {
		return err
	}
	if err := expected.Validate(); err != nil {
		return err
	}
	if len(events) == 0 {
		return &ValidationError{Field: "events", Index: -1, Reason: "nothing to append: pass at least one event"}
	}
	var ids map[[16]byte]int
	for i, e := range events {
		if err := validateName("Type", i, e.Type, MaxTypeLength); err != nil {
			return err
		}
		if len(e.Payload) == 0 {
			return &ValidationError{Field: "Payload", Index: i, Reason: "empty; pass a JSON value such as {} or null"}
		}
		if err := validateJSON("Payload", i, e.Payload); err != nil {
			return err
		}
		if e.Metadata != nil {
			if err := validateJSON("Metadata", i, e.Metadata); err != nil {
				return err
			}
		}
		if !isZeroID(e.ID) {
			if ids == nil {
				ids = make(map[[16]byte]int, len(events))
			}
			if j, dup := ids[e.ID]; dup {
				return &ValidationError{Field: "ID", Index: i, Reason: fmt.Sprintf("%s is also the id of events[%d]; each event needs its own id", e.ID, j)}
			}
			ids[e.ID] = i
		}
	}
	return nil
}

// ValidateReadOptions checks opts and returns the limit to use.
func ValidateReadOptions(opts ReadOptions) (int, error) {
	limit, err := ValidateLimit(opts.Limit)
	if err != nil {
		return 0, err
	}
	for i, t := range opts.Types {
		if err := validateName("Types", i, t, MaxTypeLength); err != nil {
			return 0, err
		}
	}
	return limit, nil
}

// ValidateLimit checks a page size and returns the one to use (ReadLimitDefault for 0).
func ValidateLimit(limit int) (int, error) {
	switch {
	case limit == 0:
		return ReadLimitDefault, nil
	case limit < 0 || limit > ReadLimitMax:
		return 0, &ValidationError{Field: "Limit", Index: -1, Reason: fmt.Sprintf("%d is out of range; use 1 to %d (0 means %d)", limit, ReadLimitMax, ReadLimitDefault)}
	}
	return limit, nil
}

// ValidateStreamID checks a stream id as Append and ReadStream do.
func ValidateStreamID(streamID string) error {
	return validateName("StreamID", -1, streamID, MaxStreamIDLength)
}

func validateName(field string, index int, s string, maxLen int) error {
	switch {
	case strings.TrimSpace(s) == "":
		return &ValidationError{Field: field, Index: index, Reason: "empty; it must name something"}
	case len(s) > maxLen:
		return &ValidationError{Field: field, Index: index, Reason: fmt.Sprintf("%d bytes long; at most %d allowed", len(s), maxLen)}
	case !utf8.ValidString(s):
		return &ValidationError{Field: field, Index: index, Reason: "not valid UTF-8"}
	case strings.ContainsRune(s, 0):
		return &ValidationError{Field: field, Index: index, Reason: "contains a NUL byte"}
	}
	return nil
}

func validateJSON(field string, index int, raw json.RawMessage) error {
	if !json.Valid(raw) {
		return &ValidationError{Field: field, Index: index, Reason: "not valid JSON"}
	}
	// PostgreSQL's jsonb cannot hold the NUL character; refuse it in every store alike.
	if hasNULEscape(raw) {
		return &ValidationError{Field: field, Index: index, Reason: `contains the escape \u0000, which PostgreSQL's jsonb cannot store`}
	}
	return nil
}

// hasNULEscape reports whether raw holds the JSON escape \u0000 (and not an escaped backslash
// followed by "u0000").
func hasNULEscape(raw []byte) bool {
	escape := []byte(`\u0000`)
	for i := bytes.Index(raw, escape); i >= 0; {
		backslashes := 0
		for j := i; j >= 0 && raw[j] == '\\'; j-- {
			backslashes++
		}
		if backslashes%2 == 1 {
			return true
		}
		next := bytes.Index(raw[i+1:], escape)
		if next < 0 {
			return false
		}
		i += 1 + next
	}
	return false
}

func isZeroID(id [16]byte) bool { return id == [16]byte{} }

// CheckRepeat decides an append some of whose event ids are already stored: found holds the
// stored events with those ids. The append is an idempotent repeat, and CheckRepeat returns nil,
// when every event to append has an id, all of them are stored in streamID, with the same types,
// at consecutive versions in the same order. Otherwise it returns a *DuplicateEventError naming
// the append's first stored id. found is sorted into the append's order.
func CheckRepeat(streamID string, events []EventData, found []Event) error {
	byID := make(map[[16]byte]Event, len(found))
	for _, e := range found {
		byID[e.ID] = e
	}
	for i, d := range events {
		e, ok := byID[d.ID]
		if !ok || e.StreamID != streamID || e.Type != d.Type || (i > 0 && e.StreamVersion != found[i-1].StreamVersion+1) {
			for _, d := range events {
				if _, stored := byID[d.ID]; stored {
					return &DuplicateEventError{EventID: d.ID, StreamID: streamID}
				}
			}
		}
		found[i] = e
	}
	return nil
}
