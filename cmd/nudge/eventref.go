package main

import (
	"fmt"

	"github.com/nudgeworks/nudge/eventstore"
)

// eventRefJSON is an eventstore.EventRef as --json prints it: the failing event of `nudge
// status` and of `nudge deadletter list/show` have this one shape.
type eventRefJSON struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	StreamID string `json:"stream_id"`
	Position string `json:"position"`
}

// toEventRefJSON returns e as --json prints it; nil for nil.
func toEventRefJSON(e *eventstore.EventRef) *eventRefJSON {
	if e == nil {
		return nil
	}
	return &eventRefJSON{ID: e.ID.String(), Type: e.Type, StreamID: e.StreamID, Position: e.Position.String()}
}

// eventRefText is e in one line of text, its type and stream made safe for a terminal.
func eventRefText(e eventstore.EventRef) string {
	return fmt.Sprintf("event %s (type %s, stream %q, position %s)", e.ID, terminalSafe(e.Type), e.StreamID, e.Position)
}

// streamText is a stream id for a table cell: made safe for a terminal, "-" when unknown (a
// dead letter written before dead letters kept the stream).
func streamText(id string) string {
	if id == "" {
		return "-"
	}
	return terminalSafe(id)
}
