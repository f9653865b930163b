package projection_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
)

// TestHandlerError: the error names the event it failed on (an eventstore.EventRef), matches
// ErrHandler and unwraps to the handler's error, also when wrapped.
func TestHandlerError(t *testing.T) {
	t.Parallel()
	bug := errors.New("price must not be negative")
	e := eventstore.Event{ID: uuid.MustParse("0190d6c2-7a4e-7b8a-9c1d-2e3f4a5b6c7d"), StreamID: "ticket-42", Type: "TicketPriced",
		Position: eventstore.Position{TransactionID: 7414, GlobalPosition: 1203}}
	var err error = &projection.HandlerError{Projection: "tickets", Event: e.Ref(), Err: bug}
	require.EqualError(t, err, `projection tickets: handling event 0190d6c2-7a4e-7b8a-9c1d-2e3f4a5b6c7d `+
		`(type TicketPriced, stream "ticket-42", position 7414/1203): price must not be negative`)

	err = fmt.Errorf("catch up: %w", err)
	require.ErrorIs(t, err, projection.ErrHandler)
	require.ErrorIs(t, err, bug)
	var he *projection.HandlerError
	require.ErrorAs(t, err, &he)
	require.Equal(t, e.Ref(), he.Event)
}
