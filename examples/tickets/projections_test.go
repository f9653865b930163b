package main

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge"
	"github.com/nudgeworks/nudge/nudgetest"
	"github.com/nudgeworks/nudge/projection"
)

// newProjectionKit returns a kit for ticket_list and ticket_stats on a database of t's own:
// the projections run without a broker or the HTTP API.
func newProjectionKit(t *testing.T) *nudgetest.Kit {
	t.Helper()
	projections, err := newReadModels("", TitleWidthDefault, slog.New(slog.DiscardHandler)).projections()
	require.NoError(t, err)
	return nudgetest.New(t, nudgetest.Database(t, nudgetest.Options{}), nudge.Config{Projections: projections})
}

func registerTicket(t *testing.T, kit *nudgetest.Kit, id, title, customer string) {
	t.Helper()
	kit.Append(t, streamID(id), nudgetest.Event(t, TypeTicketRegistered, TicketRegistered{ID: id, Title: title, Customer: customer}))
}

// TestTicketProjections: ticket_list keeps a row per ticket and ticket_stats counts open and
// closed tickets per customer, over batches that both register and close.
func TestTicketProjections(t *testing.T) {
	t.Parallel()
	kit := newProjectionKit(t)
	registerTicket(t, kit, "t1", "Printer on fire", "acme")
	registerTicket(t, kit, "t2", "Coffee machine leaks", "acme")
	registerTicket(t, kit, "t3", "VPN drops every hour", "globex")
	kit.Append(t, streamID("t1"), nudgetest.Event(t, TypeTicketClosed, TicketClosed{ID: "t1", Reason: "replaced the toner"}))
	kit.RunToHead(t)

	kit.RequireRows(t, []nudgetest.Row{
		{"id": "t1", "status": StatusClosed, "close_reason": "replaced the toner"},
		{"id": "t2", "status": StatusOpen, "close_reason": nil},
		{"id": "t3", "status": StatusOpen, "close_reason": nil},
	}, `SELECT id, status, close_reason FROM ticket_list ORDER BY id`)
	kit.RequireRows(t, []nudgetest.Row{
		{"customer": "acme", "open": 1, "closed": 1},
		{"customer": "globex", "open": 1, "closed": 0},
	}, `SELECT customer, open, closed FROM ticket_stats ORDER BY customer`)
	kit.RequireCondition(t, ProjectionTicketList, projection.ConditionCaughtUp)
}

// TestTicketListPoison is README.md's poison without the service: a title longer than the
// column stops ticket_list before its event, naming it, while ticket_stats counts it.
func TestTicketListPoison(t *testing.T) {
	t.Parallel()
	kit := newProjectionKit(t)
	registerTicket(t, kit, "t1", "Printer on fire", "acme")
	registerTicket(t, kit, "t2", strings.Repeat("x", 150), "globex")
	require.Error(t, kit.CatchUp(t, ProjectionTicketList))
	kit.RunToHead(t, ProjectionTicketStats)

	st := kit.RequireFailure(t, ProjectionTicketList, "value too long for type character varying(100)")
	require.Equal(t, streamID("t2"), st.FailingEvent.StreamID, "the status names the poison event")
	kit.RequireRows(t, []nudgetest.Row{{"id": "t1"}}, `SELECT id FROM ticket_list ORDER BY id`)
	kit.RequireRows(t, []nudgetest.Row{{"customer": "acme", "open": 1}, {"customer": "globex", "open": 1}},
		`SELECT customer, open FROM ticket_stats ORDER BY customer`)
}
