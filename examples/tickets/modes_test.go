package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSplitModes: an API process (--mode api) and two workers (--mode worker) on one database
// and broker, on both channels. The API runs nothing in the background: events appended while
// no worker runs wait, and the workers handle them when they start, and publish the triggers
// (each worker runs the relay); the workers share the work without handling an event twice; one
// worker stopping does not stop the projections. The API's /metrics shows no trigger counters:
// it has no handlers to count them.
func TestSplitModes(t *testing.T) {
	t.Parallel()
	eachChannel(t, func(t *testing.T, e *testEnv) {
		api := e.start(e.config(ModeAPI))
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
		require.Nil(t, st.Relay, "an API process publishes no triggers: the relay has not run yet")
		var res response
		require.Eventually(t, func() bool { // a read of its own, which a moment's hold may lower too
			res = api.do(t, http.MethodGet, "/metrics", "")
			return res.status == http.StatusOK && strings.Contains(string(res.body), `nudge_projection_lag_events{projection="ticket_list"} 2`)
		}, waitFor, tick, "the metrics show ticket_list's lag of two events")
		require.NotRegexp(t, `(?m)^nudge_worker_`, string(res.body), "no handlers here, no trigger counters")

		w1 := e.start(e.config(ModeWorker))
		w2 := e.start(e.config(ModeWorker))
		require.Nil(t, w1.server, "a worker serves no HTTP")
		st = api.waitCaughtUp(t)
		require.NotNil(t, st.Relay, "the workers run the relay")
		require.Len(t, api.tickets(t, ""), 2)

		w1.stop()
		received := w2.svc.client.Worker().Stats(ProjectionTicketList).Received
		api.call(t, http.MethodPost, "/tickets/"+printer+"/close", bodyClose, http.StatusOK, nil)
		api.register(t, bodyVPN)
		st = api.waitCaughtUp(t)
		for _, p := range st.Projections {
			require.EqualValues(t, 4, p.EventsProcessed, "%s: every event once, whichever worker handled it", p.Name)
		}
		require.Equal(t, []string{printer}, ids(api.tickets(t, "?status=closed")))
		// A batch already running on w2 may have read the new events before their triggers
		// arrive: the triggers come, but maybe after the projection caught up.
		require.Eventually(t, func() bool {
			return w2.svc.client.Worker().Stats(ProjectionTicketList).Received > received
		}, waitFor, tick, "the remaining worker's relay published the triggers, and its handlers got them")
	})
}

// TestAPIWithoutBroker: an API process needs no broker to start, append and report status
// (its broker URL points where nothing listens); only a replay publishes, and it answers 503
// with ErrBrokerUnavailable's message rather than failing the process. Before, open connected
// to the broker in every mode and an API process could not start while RabbitMQ was down.
func TestAPIWithoutBroker(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, ChannelAMQP)
	cfg := e.config(ModeAPI)
	cfg.AMQPURL = "amqp://guest:guest@127.0.0.1:1/"
	api := e.start(cfg)
	api.register(t, bodyPrinter)
	require.Eventually(t, func() bool {
		return api.status(t).Projections[0].LagEvents == 1
	}, waitFor, tick, "the event is appended and waits for a worker")
	res := api.do(t, http.MethodPost, "/replay?projection=all", "")
	require.Equal(t, http.StatusServiceUnavailable, res.status, "%s", res.body)
	require.Contains(t, string(res.body), ErrBrokerUnavailable.Error())
}
