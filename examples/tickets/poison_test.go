package main

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
)

// TestPoisonWalkthrough is README.md's walk-through, on both channels: a 150-character title
// (the API takes 200, ticket_list's column 100) fails ticket_list, which retries and
// dead-letters the trigger, naming the event; ticket_stats counts everything meanwhile and
// ticket_list waits before the event, skipping nothing. Then the fix, two ways:
//
//   - restart: the service restarts with --title-width 200; ticket_list's init hook widens the
//     column, and the worker replays the dead letter at start;
//   - replay: an operator widens the column by hand, without a restart, and replays the dead
//     letter with POST /replay.
//
// Either way ticket_list catches up with every event, each once, and the dead letter is marked
// replayed.
func TestPoisonWalkthrough(t *testing.T) {
	t.Parallel()
	for _, heal := range []string{"restart", "replay"} {
		t.Run(heal, func(t *testing.T) {
			t.Parallel()
			eachChannel(t, func(t *testing.T, e *testEnv) { poisonWalkthrough(t, e, heal) })
		})
	}
}

func poisonWalkthrough(t *testing.T, e *testEnv, heal string) {
	ctx := context.Background()
	api := e.start(e.config(ModeAll))
	printer := api.register(t, bodyPrinter)
	api.waitCaughtUp(t)

	// 1. The poison: the API accepts it, ticket_list cannot store it.
	long := api.register(t, bodyLong)
	var list projectionJSON
	require.Eventually(t, func() bool {
		list = api.status(t).projection(t, ProjectionTicketList)
		return len(list.DeadLetters) > 0
	}, waitFor, tick, "ticket_list's trigger is dead-lettered after its retries")
	require.Equal(t, "failing", string(list.State), "status %+v", list)
	require.False(t, list.CaughtUp)
	require.NotNil(t, list.FailingEvent)
	require.Equal(t, TypeTicketRegistered, list.FailingEvent.Type)
	require.Equal(t, streamID(long), list.FailingEvent.StreamID, "the status names the poison event")
	require.Contains(t, list.LastError, "value too long for type character varying(100)")
	require.Len(t, list.DeadLetters, 1)
	dl := list.DeadLetters[0]
	require.Equal(t, list.FailingEvent.ID, dl.EventID, "the dead letter names the event too")
	require.Equal(t, 3, dl.Attempts, "tried as often as the retry policy says")
	require.Contains(t, dl.Error, "value too long for type character varying(100)")

	// 2. Meanwhile ticket_stats keeps going, and ticket_list waits: it skips nothing. Each
	// trigger ticket_list gets fails on the same event and folds into the same dead letter.
	// (Waiting for each fold also means no trigger is left in flight before the fix.)
	deadLetterCount := func(n int) func() bool {
		return func() bool {
			dls := api.status(t).projection(t, ProjectionTicketList).DeadLetters
			return len(dls) == 1 && dls[0].Count == n
		}
	}
	vpn := api.register(t, bodyVPN)
	require.Eventually(t, deadLetterCount(2), waitFor, tick, "the VPN ticket's trigger folds into the dead letter")
	api.call(t, http.MethodPost, "/tickets/"+printer+"/close", bodyClose, http.StatusOK, nil)
	require.Eventually(t, deadLetterCount(3), waitFor, tick, "so does the closing's")
	require.Eventually(t, func() bool {
		return api.status(t).projection(t, ProjectionTicketStats).CaughtUp
	}, waitFor, tick, "ticket_stats catches up past the event ticket_list fails on")
	require.Equal(t, map[string]customerStats{
		"acme":   {Customer: "acme", Open: 0, Closed: 1},
		"globex": {Customer: "globex", Open: 2, Closed: 0},
	}, api.stats(t), "ticket_stats counted the long ticket and everything after it")
	tickets := api.tickets(t, "")
	require.Equal(t, []string{printer}, ids(tickets), "ticket_list stops right before the poison event")
	require.Equal(t, StatusOpen, tickets[0].Status, "…so it has not seen the later closing either")
	list = api.status(t).projection(t, ProjectionTicketList)
	require.EqualValues(t, 3, list.LagEvents, "the long ticket, the VPN ticket and the closing wait")

	// 3. The fix, then the replay.
	switch heal {
	case "restart":
		api.stop()
		cfg := e.config(ModeAll)
		cfg.TitleWidth = 200 // --title-width 200: the init hook widens the column
		api = e.start(cfg)
	case "replay":
		_, err := e.db.Pool.Exec(ctx, `ALTER TABLE ticket_list ALTER COLUMN title TYPE varchar(200)`)
		require.NoError(t, err)
		var replay replayResponse
		api.call(t, http.MethodPost, "/replay?projection=ticket_list", "", http.StatusOK, &replay)
		require.Equal(t, replayResponse{Replayed: 1, Projections: []string{ProjectionTicketList}}, replay)
	}

	// 4. Caught up: every event handled once, none skipped. (After a restart the worker may
	// catch up before its replay at start has marked the dead letter: wait for both.)
	var st statusJSON
	require.Eventually(t, func() bool {
		st = api.status(t)
		return st.CaughtUp && len(st.projection(t, ProjectionTicketList).DeadLetters) == 0
	}, waitFor, tick, "ticket_list catches up and its dead letter is replayed")
	list = st.projection(t, ProjectionTicketList)
	require.Nil(t, list.FailingEvent)
	require.Empty(t, list.LastError)
	require.EqualValues(t, 4, list.EventsProcessed, "four events, each handled once")
	tickets = api.tickets(t, "")
	require.Equal(t, []string{printer, long, vpn}, ids(tickets))
	require.Equal(t, StatusClosed, tickets[0].Status)
	require.Equal(t, longTitle, tickets[1].Title, "the long title is stored whole")

	records, err := api.svc.client.DeadLetters().List(ctx, deadletter.Filter{Projection: ProjectionTicketList})
	require.NoError(t, err)
	require.Len(t, records, 1)
	require.Equal(t, deadletter.StatusReplayed, records[0].Status)
	wantBy := map[string]string{"restart": "worker start", "replay": replayedBy}[heal]
	require.Equal(t, wantBy, records[0].ReplayedBy)
}
