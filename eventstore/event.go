package eventstore

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/nudgeworks/nudge/internal/namecheck"
)

// Event is one recorded event as read back from a store.
type Event struct {
	// ID identifies the event globally. Appending an event whose ID already exists never
	// creates a second row.
	ID uuid.UUID
	// StreamID is the stream the event belongs to.
	StreamID string
	// StreamVersion is the event's place in its stream: 1 for the first event, then 2, 3, …
	StreamVersion int64
	// Type names the kind of event, e.g. "TicketWasRegistered". Projections select events by it.
	Type string
	// Payload is the event's JSON body.
	Payload json.RawMessage
	// Metadata is optional JSON (correlation ids, actor, …); nil when none was given.
	Metadata json.RawMessage
	// RecordedAt is when the store wrote the event.
	RecordedAt time.Time
	// Position is the event's place in the global read order.
	Position Position
}

// EventData is an event to append.
type EventData struct {
	// ID identifies the event. Leave it zero to have the store assign a new UUIDv7; set it to
	// make a retried append idempotent (see Store.Append).
	ID uuid.UUID
	// Type names the kind of event. Required; at most MaxTypeLength bytes.
	Type string
	// Payload is the event's body and must be valid JSON (an object, array, string, … or null).
	// Required. With Metadata at most the store's Limits.MaxEventBytes (1 MiB by default).
	Payload json.RawMessage
	// Metadata is optional JSON. Nil stores no metadata.
	Metadata json.RawMessage
}

// NewEventData returns EventData of the given type with v encoded as its JSON payload. An event
// type that Append would refuse (empty, longer than MaxTypeLength, not UTF-8) fails here
// already, with a *ValidationError.
func NewEventData(eventType string, v any) (EventData, error) {
	if reason := namecheck.Problem(eventType, MaxTypeLength); reason != "" {
		return EventData{}, &ValidationError{Field: "Type", Index: -1, Reason: reason}
	}
	payload, err := json.Marshal(v)
	if err != nil {
		return EventData{}, &ValidationError{Field: "Payload", Index: -1, Reason: fmt.Sprintf("cannot encode %T as JSON: %v", v, err)}
	}
	return EventData{Type: eventType, Payload: payload}, nil
}

// AppendResult describes a successful append.
type AppendResult struct {
	// Events are the appended events as stored, in stream order, with their positions.
	Events []Event
	// StreamVersion is the stream's version after the append (the last event's StreamVersion).
	StreamVersion int64
	// Idempotent is true when every event had already been appended by an earlier call with the
	// same IDs and nothing new was written; Events then holds the earlier events.
	Idempotent bool
}

// Last returns the position of the last appended event.
func (r AppendResult) Last() Position {
	if len(r.Events) == 0 {
		return Position{}
	}
	return r.Events[len(r.Events)-1].Position
}

// Types returns the distinct event types of the append in first-seen order.
func (r AppendResult) Types() []string {
	var types []string
	seen := make(map[string]bool, len(r.Events))
	for _, e := range r.Events {
		if !seen[e.Type] {
			seen[e.Type] = true
			types = append(types, e.Type)
		}
	}
	return types
}
