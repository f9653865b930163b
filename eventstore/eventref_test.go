package eventstore_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
)

func TestEventRef(t *testing.T) {
	t.Parallel()
	e := eventstore.Event{
		ID: uuid.New(), StreamID: "ticket-1", StreamVersion: 3, Type: "TicketClosed",
		Payload: []byte(`{}`), Position: eventstore.Position{TransactionID: 7, GlobalPosition: 42},
	}
	require.Equal(t, eventstore.EventRef{ID: e.ID, Type: "TicketClosed", StreamID: "ticket-1", Position: e.Position}, e.Ref())
}
