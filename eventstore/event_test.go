package eventstore_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
)

func TestNewEventData(t *testing.T) {
	t.Parallel()
	d, err := eventstore.NewEventData("TicketRegistered", map[string]string{"id": "t-1"})
	require.NoError(t, err)
	require.Equal(t, "TicketRegistered", d.Type)
	require.JSONEq(t, `{"id": "t-1"}`, string(d.Payload))

	for typ, reason := range map[string]string{
		"":                       "empty",
		"  ":                     "empty",
		strings.Repeat("T", 256): "256 bytes long; at most 255 allowed",
		"Ticket\xffRegistered":   "UTF-8",
		"Ticket\x00Registered":   "NUL",
	} {
		_, err := eventstore.NewEventData(typ, struct{}{})
		require.ErrorIs(t, err, eventstore.ErrInvalidInput, "%q fails at once, not at the append", typ)
		var ve *eventstore.ValidationError
		require.ErrorAs(t, err, &ve)
		require.Equal(t, "Type", ve.Field)
		require.Contains(t, ve.Reason, reason)
	}

	_, err = eventstore.NewEventData("A", func() {})
	require.ErrorIs(t, err, eventstore.ErrInvalidInput)
	require.ErrorContains(t, err, "cannot encode func() as JSON")
}
