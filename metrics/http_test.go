package metrics_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	dlmemory "github.com/nudgeworks/nudge/deadletter/memory"
	"github.com/nudgeworks/nudge/projection"
)

// TestHTTPExposition: a promhttp handler on the registry serves the expected series in the
// text format, and a failing scrape-time query does not fail the scrape.
func TestHTTPExposition(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	r := newFakeRunner()
	r.fail["b"] = context.DeadlineExceeded
	require.NoError(t, m.WatchRunner(r))
	require.NoError(t, m.WatchWorker(fakeStats{"a": {Received: 4, Redundant: 3}}, "a", "b"))
	dead := dlmemory.New(dlmemory.Config{})
	addDeadLetter(t, dead, "a")
	require.NoError(t, m.WatchDeadLetters(dead, "a", "b"))
	m.ObserveBatch(projection.BatchReport{Projection: "a", Events: 5, Took: 30 * time.Millisecond})

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	defer srv.Close()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = res.Body.Close() }()
	require.Equal(t, http.StatusOK, res.StatusCode, "a failed status query is not a failed scrape")
	require.Contains(t, res.Header.Get("Content-Type"), "text/plain")
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	text := string(body)
	for _, line := range []string{
		`# TYPE nudge_projection_events_projected_total counter`,
		`nudge_projection_events_projected_total{projection="a"} 5`,
		`nudge_projection_batches_total{outcome="committed",projection="a"} 1`,
		`nudge_projection_batch_duration_seconds_bucket{projection="a",le="0.05"} 1`,
		`nudge_projection_batch_duration_seconds_count{projection="a"} 1`,
		`# TYPE nudge_projection_lag_events gauge`,
		`nudge_projection_lag_events{projection="a"} 12`,
		`nudge_projection_lag_seconds{projection="a"} 1.5`,
		`nudge_projection_state{projection="a",state="running"} 1`,
		`nudge_projection_held_by_horizon{projection="a"} 0`,
		`nudge_worker_triggers_received_total{projection="a"} 4`,
		`nudge_worker_triggers_redundant_total{projection="a"} 3`,
		`nudge_worker_triggers_received_total{projection="b"} 0`,
		`nudge_dead_letters_failed{projection="a"} 1`,
		`nudge_dead_letters_failed{projection="b"} 0`,
		`nudge_metrics_collect_errors_total{source="status"} 1`,
		`nudge_metrics_collect_errors_total{source="dead_letters"} 0`,
	} {
		require.Contains(t, text, line+"\n")
	}
	require.NotContains(t, text, `nudge_projection_lag_events{projection="b"}`)
}
