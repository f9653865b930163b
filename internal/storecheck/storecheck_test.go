package storecheck_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/storecheck"
)

// TestAppendChecksSizesFirst: the limits are checked before any event's content, so an
// oversized append costs no JSON scan; a bad event within the limits is still refused.
func TestAppendChecksSizesFirst(t *testing.T) {
	t.Parallel()
	limits := eventstore.Limits{MaxEventBytes: 10}
	bad := eventstore.EventData{Type: "", Payload: json.RawMessage(`{"not json at all`)}
	err := storecheck.Append("s", eventstore.Any, []eventstore.EventData{bad}, limits)
	require.ErrorIs(t, err, eventstore.ErrTooLarge)

	bad.Payload = json.RawMessage(`{`)
	err = storecheck.Append("s", eventstore.Any, []eventstore.EventData{bad}, limits)
	require.NotErrorIs(t, err, eventstore.ErrTooLarge)
	require.ErrorContains(t, err, "events[0].Type: empty")

	require.NoError(t, storecheck.Append("s", eventstore.Any, []eventstore.EventData{{Type: "A", Payload: json.RawMessage(`{}`)}}, eventstore.Limits{}),
		"zero limits mean the defaults, not nothing")
}

func TestEventType(t *testing.T) {
	t.Parallel()
	require.NoError(t, storecheck.EventType("TicketRegistered"))
	require.ErrorIs(t, storecheck.EventType(""), eventstore.ErrInvalidInput)
}
