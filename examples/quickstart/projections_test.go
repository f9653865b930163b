package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge"
	"github.com/nudgeworks/nudge/nudgetest"
	"github.com/nudgeworks/nudge/projection"
)

// TestTicketListHeals tests the demo's projections alone, in memory, with no broker: a type
// longer than ticket_list takes stops it before that event while ticket_stats counts
// everything; after the fix ticket_list reads on from where it stopped, each event once.
func TestTicketListHeals(t *testing.T) {
	t.Parallel()
	models := &readModels{tickets: map[string]string{}, stats: map[string]int{}, handled: map[string]int{}}
	models.maxType.Store(25)
	list, stats, err := models.projections()
	require.NoError(t, err)
	kit := nudgetest.NewInMemory(t, nudge.Config{Projections: []*projection.Projection{list, stats}})

	register := func(id, typ string) {
		kit.Append(t, "ticket-"+id, nudgetest.Event(t, "TicketWasRegistered", TicketWasRegistered{ID: id, Type: typ}))
	}
	register("1", "bug")
	// OnIdempotent handlers are at least once: a batch that fails after an event runs it again
	// when it commits the events before the failure. Ticket 1 is handled in a batch of its own.
	kit.RunToHead(t)
	register("2", strings.Repeat("x", 30))
	register("3", "question")
	kit.Append(t, "ticket-1", nudgetest.Event(t, "TicketWasClosed", TicketWasClosed{ID: "1"}))

	require.Error(t, kit.CatchUp(t, "ticket_list"))
	st := kit.RequireFailure(t, "ticket_list", "value too long for type character varying(25)")
	require.Equal(t, "ticket-2", st.FailingEvent.StreamID, "the status names the failing event")
	kit.RunToHead(t, "ticket_stats")
	tickets, _, registered, closed := models.snapshot()
	require.Equal(t, []int{1, 3, 1}, []int{tickets, registered, closed}, "ticket_list waits, ticket_stats kept going")

	models.maxType.Store(100) // the fix
	kit.RunToHead(t)
	kit.RequireCondition(t, "ticket_list", projection.ConditionCaughtUp)
	tickets, closedTickets, _, _ := models.snapshot()
	require.Equal(t, []int{3, 1}, []int{tickets, closedTickets})
	models.mu.Lock()
	defer models.mu.Unlock()
	for id, n := range models.handled {
		require.Equal(t, 1, n, "event %s handled once", id)
	}
	require.Len(t, models.handled, 4)
}
