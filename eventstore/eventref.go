package eventstore

import "github.com/google/uuid"

// EventRef names one recorded event without its payload: what a projection's status, a dead
// letter, a skip record and a handler error say about the event they are about. It is the one
// shape of "the failing event" every package shares.
type EventRef struct {
	// ID is the event's id.
	ID uuid.UUID
	// Type is the event's type.
	Type string
	// StreamID is the stream the event belongs to.
	StreamID string
	// Position is the event's place in the global read order.
	Position Position
}

// Ref returns the reference to e: its id, type, stream and position.
func (e Event) Ref() EventRef {
	return EventRef{ID: e.ID, Type: e.Type, StreamID: e.StreamID, Position: e.Position}
}
