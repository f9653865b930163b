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

// TestExpectedVersionTable: Any (the zero value), NoStream and Exact are constants and values that
// Check, Validate and String tell apart; a negative Exact version is refused.
func TestExpectedVersionTable(t *testing.T) {
	t.Parallel()
	var zero eventstore.ExpectedVersion
	require.Equal(t, eventstore.Any, zero)
	cases := []struct {
		e          eventstore.ExpectedVersion
		current    int64
		ok         bool
		text       string
		validation bool
	}{
		{eventstore.Any, 0, true, "any", false},
		{eventstore.Any, 7, true, "any", false},
		{eventstore.NoStream, 0, true, "no stream", false},
		{eventstore.NoStream, 1, false, "no stream", false},
		{eventstore.Exact(0), 0, true, "exactly 0", false},
		{eventstore.Exact(0), 1, false, "exactly 0", false},
		{eventstore.Exact(7), 7, true, "exactly 7", false},
		{eventstore.Exact(7), 6, false, "exactly 7", false},
		{eventstore.Exact(-1), 0, false, "invalid (a negative Exact version)", true},
	}
	for _, c := range cases {
		require.Equal(t, c.ok, c.e.Check(c.current), "%s at %d", c.e, c.current)
		require.Equal(t, c.text, c.e.String())
		if c.validation {
			require.ErrorIs(t, c.e.Validate(), eventstore.ErrInvalidInput)
		} else {
			require.NoError(t, c.e.Validate())
		}
	}
	require.NotEqual(t, eventstore.Exact(0), eventstore.Exact(1))
}
