package main

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSplitModes: an API process (--mode api) and two workers (--mode worker) on one database
// and broker, on both channels. Triggers published while no worker runs wait in the
// projections' subscriptions; the workers share the work without handling an event twice; one
// worker stopping does not stop the projections.
func TestSplitModes(t *testing.T) {
	t.Parallel()
	eachChannel(t, func(t *testing.T, e *testEnv) {
		api := e.start(e.config(ModeAPI))
		require.Nil(t, api.svc.worker, "an API process runs no projections")
		require.NotNil(t, api.svc.relay, "it runs the relay, on either channel")

		printer := api.register(t, bodyPrinter)
		api.register(t, bodyCoffee)
		var st statusJSON
		require.Eventually(t, func() bool { // (an open transaction elsewhere may hold the events back a moment)
			st = api.status(t)
			return st.Projections[0].LagEvents == 2 && st.Projections[1].LagEvents == 2
		}, waitFor, tick, "both projections lag by the two events")
		require.Equal(t, ModeAPI, st.Mode)
		for _, p := range st.Projections {
			require.Zero(t, p.EventsProcessed, "%s: nothing handles the events without a worker", p.Name)
		}

		w1 := e.start(e.config(ModeWorker))
		w2 := e.start(e.config(ModeWorker))
		require.Nil(t, w1.server, "a worker serves no HTTP")
		require.Nil(t, w1.svc.relay, "a worker publishes no triggers")
		api.waitCaughtUp(t)
		require.Len(t, api.tickets(t, ""), 2)

		w1.stop()
		received := w2.svc.worker.Stats(ProjectionTicketList).Received
		api.call(t, http.MethodPost, "/tickets/"+printer+"/close", bodyClose, http.StatusOK, nil)
		api.register(t, bodyVPN)
		st = api.waitCaughtUp(t)
		for _, p := range st.Projections {
			require.EqualValues(t, 4, p.EventsProcessed, "%s: every event once, whichever worker handled it", p.Name)
		}
		require.Equal(t, []string{printer}, ids(api.tickets(t, "?status=closed")))
		require.Greater(t, w2.svc.worker.Stats(ProjectionTicketList).Received, received, "the remaining worker got the triggers")
	})
}
