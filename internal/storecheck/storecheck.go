// Package storecheck holds the checks every event store backend applies to its input before it
// touches storage, so that eventstore/postgres and eventstore/memory accept and refuse the same
// calls with the same errors. Users never call it: the stores do.
package storecheck

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/namecheck"
)

// Append checks an append's arguments against limits (zero fields mean the defaults). Sizes and
// counts are checked first, so an oversized append is refused before its JSON is even scanned.
func Append(streamID string, expected eventstore.ExpectedVersion, events []eventstore.EventData, limits eventstore.Limits) error {
	if err := StreamID(streamID); err != nil {
		return err
	}
	if err := expected.Validate(); err != nil {
		return err
	}
	if len(events) == 0 {
		return &eventstore.ValidationError{Field: "events", Index: -1, Reason: "nothing to append: pass at least one event"}
	}
	if err := sizes(events, limits.WithDefaults()); err != nil {
		return err
	}
	var ids map[[16]byte]int
	for i, e := range events {
		if err := eventData(i, e); err != nil {
			return err
		}
		if e.ID != [16]byte{} {
			if ids == nil {
				ids = make(map[[16]byte]int, len(events))
			}
			if j, dup := ids[e.ID]; dup {
				return &eventstore.ValidationError{Field: "ID", Index: i, Reason: fmt.Sprintf("%s is also the id of events[%d]; each event needs its own id", e.ID, j)}
			}
			ids[e.ID] = i
		}
	}
	return nil
}

// sizes checks the append against l, which has its defaults.
func sizes(events []eventstore.EventData, l eventstore.Limits) error {
	if len(events) > l.MaxAppendEvents {
		return &eventstore.TooLargeError{Limit: eventstore.LimitAppendEvents, Index: -1, Size: len(events), Max: l.MaxAppendEvents}
	}
	total := 0
	for i, e := range events {
		size := len(e.Payload) + len(e.Metadata)
		if size > l.MaxEventBytes {
			return &eventstore.TooLargeError{Limit: eventstore.LimitEventBytes, Index: i, Size: size, Max: l.MaxEventBytes}
		}
		total += size
	}
	if total > l.MaxAppendBytes {
		return &eventstore.TooLargeError{Limit: eventstore.LimitAppendBytes, Index: -1, Size: total, Max: l.MaxAppendBytes}
	}
	return nil
}

// eventData checks one event to append, the index'th.
func eventData(index int, e eventstore.EventData) error {
	if err := name("Type", index, e.Type, eventstore.MaxTypeLength); err != nil {
		return err
	}
	if len(e.Payload) == 0 {
		return &eventstore.ValidationError{Field: "Payload", Index: index, Reason: "empty; pass a JSON value such as {} or null"}
	}
	if err := jsonValue("Payload", index, e.Payload); err != nil {
		return err
	}
	if e.Metadata != nil {
		return jsonValue("Metadata", index, e.Metadata)
	}
	return nil
}

// ReadOptions checks opts and returns the limit to use.
func ReadOptions(opts eventstore.ReadOptions) (int, error) {
	limit, err := Limit(opts.Limit)
	if err != nil {
		return 0, err
	}
	for i, t := range opts.Types {
		if err := name("Types", i, t, eventstore.MaxTypeLength); err != nil {
			return 0, err
		}
	}
	if err := opts.Partition.Validate(); err != nil {
		return 0, err
	}
	return limit, nil
}

// EventType checks an event type as Append and Read do.
func EventType(t string) error {
	return name("Type", -1, t, eventstore.MaxTypeLength)
}

// Limit checks a page size and returns the one to use (eventstore.ReadLimitDefault for 0).
func Limit(limit int) (int, error) {
	switch {
	case limit == 0:
		return eventstore.ReadLimitDefault, nil
	case limit < 0 || limit > eventstore.ReadLimitMax:
		return 0, &eventstore.ValidationError{Field: "Limit", Index: -1, Reason: fmt.Sprintf("%d is out of range; use 1 to %d (0 means %d)",
			limit, eventstore.ReadLimitMax, eventstore.ReadLimitDefault)}
	}
	return limit, nil
}

// StreamID checks a stream id as Append and ReadStream do.
func StreamID(streamID string) error {
	return name("StreamID", -1, streamID, eventstore.MaxStreamIDLength)
}

func name(field string, index int, s string, maxLen int) error {
	if reason := namecheck.Problem(s, maxLen); reason != "" {
		return &eventstore.ValidationError{Field: field, Index: index, Reason: reason}
	}
	return nil
}

func jsonValue(field string, index int, raw json.RawMessage) error {
	if !json.Valid(raw) {
		return &eventstore.ValidationError{Field: field, Index: index, Reason: "not valid JSON"}
	}
	// PostgreSQL's jsonb cannot hold the NUL character; refuse it in every store alike.
	if hasNULEscape(raw) {
		return &eventstore.ValidationError{Field: field, Index: index, Reason: `contains the escape \u0000, which PostgreSQL's jsonb cannot store`}
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

// Repeat decides an append some of whose event ids are already stored: found holds the stored
// events with those ids. The append is an idempotent repeat, and Repeat returns nil, when every
// event to append has an id, all of them are stored in streamID, with the same types, at
// consecutive versions in the same order. Otherwise it returns a *eventstore.DuplicateEventError
// naming the append's first stored id. found is sorted into the append's order.
func Repeat(streamID string, events []eventstore.EventData, found []eventstore.Event) error {
	byID := make(map[[16]byte]eventstore.Event, len(found))
	for _, e := range found {
		byID[e.ID] = e
	}
	for i, d := range events {
		e, ok := byID[d.ID]
		if !ok || e.StreamID != streamID || e.Type != d.Type || (i > 0 && e.StreamVersion != found[i-1].StreamVersion+1) {
			for _, d := range events {
				if _, stored := byID[d.ID]; stored {
					return &eventstore.DuplicateEventError{EventID: d.ID, StreamID: streamID}
				}
			}
		}
		found[i] = e
	}
	return nil
}
