package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMetrics: GET /metrics serves the projections' Prometheus metrics — batches, lag and
// state read from the database, the worker's trigger counters, dead letters, Watermill's
// router metrics — on both channels.
func TestMetrics(t *testing.T) {
	t.Parallel()
	eachChannel(t, func(t *testing.T, e *testEnv) {
		api := e.start(e.config(ModeAll))
		api.register(t, bodyPrinter)
		api.register(t, bodyCoffee)
		api.waitCaughtUp(t)

		res := api.do(t, http.MethodGet, "/metrics", "")
		require.Equal(t, http.StatusOK, res.status)
		require.Contains(t, res.header.Get("Content-Type"), "text/plain")
		body := string(res.body)
		for _, name := range []string{ProjectionTicketList, ProjectionTicketStats} {
			for _, want := range []string{
				fmt.Sprintf(`nudge_projection_events_projected_total{projection=%q} 2`, name),
				fmt.Sprintf(`nudge_projection_lag_events{projection=%q} 0`, name),
				fmt.Sprintf(`nudge_projection_state{projection=%q,state="running"} 1`, name),
				fmt.Sprintf(`nudge_dead_letters_failed{projection=%q} 0`, name),
				fmt.Sprintf(`nudge_worker_triggers_received_total{projection=%q}`, name),
			} {
				require.Contains(t, body, want, "GET /metrics:\n%s", body)
			}
		}
		require.True(t, strings.Contains(body, "nudge_router_handler_execution_time_seconds"), "Watermill's router metrics")
	})
}
