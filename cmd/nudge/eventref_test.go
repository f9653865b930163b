package main

import (
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
)

// TestEventRefOutput: the failing event prints the same in every command, and text from the
// event cannot drive the terminal.
func TestEventRefOutput(t *testing.T) {
	t.Parallel()
	e := eventstore.EventRef{ID: uuid.MustParse("0190d6c2-7a4e-7b8a-9c1d-2e3f4a5b6c7d"), Type: "Ticket\x1b[31mPriced",
		StreamID: "ticket\r-42", Position: eventstore.Position{TransactionID: 7414, GlobalPosition: 1203}}
	require.Equal(t, `event 0190d6c2-7a4e-7b8a-9c1d-2e3f4a5b6c7d (type Ticket\x1b[31mPriced, stream "ticket\r-42", position 7414/1203)`,
		eventRefText(e))
	require.Equal(t, `ticket\r-42`, streamText(e.StreamID))
	require.Equal(t, "-", streamText(""), "a dead letter from before streams were kept")

	require.Nil(t, toEventRefJSON(nil))
	out, err := json.Marshal(toEventRefJSON(&e))
	require.NoError(t, err)
	require.JSONEq(t, `{"id": "0190d6c2-7a4e-7b8a-9c1d-2e3f4a5b6c7d", "type": "Ticket\u001b[31mPriced", "stream_id": "ticket\r-42", "position": "7414/1203"}`,
		string(out))
}
