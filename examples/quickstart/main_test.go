package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/testwait"
)

// TestQuickstart runs the demo and checks the story it tells ends where it should.
func TestQuickstart(t *testing.T) {
	t.Parallel()
	ctx := testwait.Context(t, 2*time.Minute)
	var out bytes.Buffer
	require.NoError(t, run(ctx, &out), out.String())
	got := out.String()
	for _, want := range []string{
		"ticket_list has 3 tickets, ticket_stats counted 3 registrations.",
		"then dead-lettered:",
		"event TicketWasRegistered at position",
		"value too long for type character varying(25)",
		"ticket_list is failing",
		"ticket_stats kept going: 6 registered, 1 closed. ticket_list still shows 3 tickets",
		"ticket_list is caught_up: 6 tickets, 1 closed, lag 0 events.",
		"Every one of its 7 events was handled once",
	} {
		require.Contains(t, got, want)
	}
}
