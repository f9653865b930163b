package metrics_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/metrics"
	"github.com/nudgeworks/nudge/projection"
)

// fakeRunner serves fixed statuses; a name in block waits for the context to end, a name in
// fail returns an error.
type fakeRunner struct {
	mu       sync.Mutex
	statuses map[string]projection.Status
	block    map[string]bool
	fail     map[string]error
	calls    atomic.Int64
}

func (f *fakeRunner) Names() []string { return []string{"a", "b"} }

func (f *fakeRunner) Status(ctx context.Context, name string) (projection.Status, error) {
	f.calls.Add(1)
	f.mu.Lock()
	st, block, err := f.statuses[name], f.block[name], f.fail[name]
	f.mu.Unlock()
	if block {
		<-ctx.Done()
		return projection.Status{}, ctx.Err()
	}
	return st, err
}

func (f *fakeRunner) set(name string, st projection.Status) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.statuses[name] = st
}

func newFakeRunner() *fakeRunner {
	return &fakeRunner{
		statuses: map[string]projection.Status{
			"a": {State: projection.StateRunning, LagEvents: 12, LagTime: 1500 * time.Millisecond},
			"b": {State: projection.StateFailing, HeldByHorizon: true},
		},
		block: map[string]bool{}, fail: map[string]error{},
	}
}

// TestWatchRunnerExposesStatuses: lag, state (one 1 among the states) and horizon, exactly,
// and the batch series created at zero.
func TestWatchRunnerExposesStatuses(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	require.NoError(t, m.WatchRunner(newFakeRunner()))

	expected := `
# HELP nudge_projection_held_by_horizon 1 while committed events of the projection's types wait behind an older open transaction (the projection waits, it never skips).
# TYPE nudge_projection_held_by_horizon gauge
nudge_projection_held_by_horizon{projection="a"} 0
nudge_projection_held_by_horizon{projection="b"} 1
# HELP nudge_projection_lag_events Readable events of the projection's types after its committed position.
# TYPE nudge_projection_lag_events gauge
nudge_projection_lag_events{projection="a"} 12
nudge_projection_lag_events{projection="b"} 0
# HELP nudge_projection_lag_seconds Age of the oldest readable event the projection has not handled; 0 when caught up.
# TYPE nudge_projection_lag_seconds gauge
nudge_projection_lag_seconds{projection="a"} 1.5
nudge_projection_lag_seconds{projection="b"} 0
# HELP nudge_projection_state The projection's state: 1 for the current one, 0 for the others.
# TYPE nudge_projection_state gauge
nudge_projection_state{projection="a",state="failing"} 0
nudge_projection_state{projection="a",state="paused"} 0
nudge_projection_state{projection="a",state="rebuilding"} 0
nudge_projection_state{projection="a",state="running"} 1
nudge_projection_state{projection="b",state="failing"} 1
nudge_projection_state{projection="b",state="paused"} 0
nudge_projection_state{projection="b",state="rebuilding"} 0
nudge_projection_state{projection="b",state="running"} 0
# HELP nudge_metrics_collect_errors_total Scrape-time queries that failed or timed out; their metrics were left out of that scrape.
# TYPE nudge_metrics_collect_errors_total counter
nudge_metrics_collect_errors_total{source="status"} 0
# HELP nudge_projection_batches_total Projection batches run in this process, by outcome: committed, failed (a handler failed) or error (the batch could not run).
# TYPE nudge_projection_batches_total counter
nudge_projection_batches_total{outcome="committed",projection="a"} 0
nudge_projection_batches_total{outcome="committed",projection="b"} 0
nudge_projection_batches_total{outcome="error",projection="a"} 0
nudge_projection_batches_total{outcome="error",projection="b"} 0
nudge_projection_batches_total{outcome="failed",projection="a"} 0
nudge_projection_batches_total{outcome="failed",projection="b"} 0
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected),
		"nudge_projection_held_by_horizon", "nudge_projection_lag_events", "nudge_projection_lag_seconds",
		"nudge_projection_state", "nudge_metrics_collect_errors_total", "nudge_projection_batches_total"))

	err := m.WatchRunner(newFakeRunner())
	require.ErrorIs(t, err, metrics.ErrAlreadyRegistered)
	require.ErrorAs(t, err, new(prometheus.AlreadyRegisteredError))
}

// TestWatchRunnerTimeout: a status query that hangs is cut at QueryTimeout; the scrape goes on
// without that projection's gauges and counts the error. The other projection is still shown.
func TestWatchRunnerTimeout(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg, CacheTTL: -1, QueryTimeout: 50 * time.Millisecond, Logger: testlog.New(t)})
	require.NoError(t, err)
	r := newFakeRunner()
	r.block["b"] = true
	r.fail["a"] = errors.New("connection refused")
	require.NoError(t, m.WatchRunner(r))

	// b's query never returns by itself: a scrape that waited for it would never end.
	gatherWithin(t, reg)
	_, found := value(t, reg, "nudge_projection_lag_events", "projection", "b")
	require.False(t, found, "no made-up value for a projection whose status could not be read")
	require.Equal(t, 6.0, mustValue(t, reg, "nudge_metrics_collect_errors_total", "source", metrics.SourceStatus),
		"two failures per scrape, three scrapes so far")
	require.Positive(t, mustValue(t, reg, "nudge_metrics_collect_duration_seconds", "source", metrics.SourceStatus), "the time the cut query took is recorded")

	r.mu.Lock()
	delete(r.fail, "a")
	r.mu.Unlock()
	require.Equal(t, 12.0, mustValue(t, reg, "nudge_projection_lag_events", "projection", "a"), "a is back")
	_, found = value(t, reg, "nudge_projection_lag_events", "projection", "b")
	require.False(t, found)
}

// TestWatchRunnerCache: within CacheTTL scrapes reuse the last statuses; after it they query
// again.
func TestWatchRunnerCache(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg, CacheTTL: time.Hour})
	require.NoError(t, err)
	r := newFakeRunner()
	require.NoError(t, m.WatchRunner(r))
	require.Equal(t, 12.0, mustValue(t, reg, "nudge_projection_lag_events", "projection", "a"))
	r.set("a", projection.Status{State: projection.StateRunning, LagEvents: 3})
	require.Equal(t, 12.0, mustValue(t, reg, "nudge_projection_lag_events", "projection", "a"), "cached")
	require.Equal(t, int64(2), r.calls.Load(), "one query per projection for both scrapes")

	reg2 := prometheus.NewPedanticRegistry()
	m2, err := metrics.New(metrics.Config{Registerer: reg2, CacheTTL: -1})
	require.NoError(t, err)
	require.NoError(t, m2.WatchRunner(r))
	require.Equal(t, 3.0, mustValue(t, reg2, "nudge_projection_lag_events", "projection", "a"))
	r.set("a", projection.Status{State: projection.StateRunning, LagEvents: 4})
	require.Equal(t, 4.0, mustValue(t, reg2, "nudge_projection_lag_events", "projection", "a"), "no cache")
}

// TestWatchRunnerConcurrentScrapesShareAQuery: scrapes that arrive while a query runs wait for
// it instead of querying the database again.
func TestWatchRunnerConcurrentScrapesShareAQuery(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg, CacheTTL: time.Hour})
	require.NoError(t, err)
	r := newFakeRunner()
	require.NoError(t, m.WatchRunner(r))
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := reg.Gather()
			require.NoError(t, err)
		}()
	}
	wg.Wait()
	require.Equal(t, int64(2), r.calls.Load(), "one query per projection for eight scrapes")
}

type badRunner struct{ names []string }

func (b badRunner) Names() []string { return b.names }
func (badRunner) Status(context.Context, string) (projection.Status, error) {
	return projection.Status{}, nil
}

func TestWatchRunnerRefusesBadInput(t *testing.T) {
	t.Parallel()
	m, _ := newMetrics(t)
	require.ErrorIs(t, m.WatchRunner(nil), metrics.ErrInvalidConfig)
	require.ErrorIs(t, m.WatchRunner(badRunner{names: []string{"a", "a"}}), metrics.ErrInvalidConfig)
	require.ErrorIs(t, m.WatchRunner(badRunner{names: []string{""}}), metrics.ErrInvalidConfig)
}

// gatherWithin scrapes g once and fails the test if the scrape has not returned within a
// (scaled) minute.
func gatherWithin(t *testing.T, g prometheus.Gatherer) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := g.Gather()
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(testwait.For(time.Minute)):
		t.Fatal("the scrape was held by a status query beyond QueryTimeout")
	}
}

// TestWatchRunnerParkedStreams: the parked-stream gauges follow the status.
func TestWatchRunnerParkedStreams(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	r := newFakeRunner()
	r.set("a", projection.Status{State: projection.StateRunning, ParkedStreams: 3, OldestParkedAt: time.Now().Add(-time.Hour)})
	require.NoError(t, m.WatchRunner(r))
	require.InDelta(t, 3, mustValue(t, reg, "nudge_projection_parked_streams", "projection", "a"), 0)
	require.GreaterOrEqual(t, mustValue(t, reg, "nudge_projection_oldest_parked_seconds", "projection", "a"), 3600.0)
	require.InDelta(t, 0, mustValue(t, reg, "nudge_projection_parked_streams", "projection", "b"), 0)
	require.InDelta(t, 0, mustValue(t, reg, "nudge_projection_oldest_parked_seconds", "projection", "b"), 0)
}

// TestWatchRunnerVersions: the version gauges follow each version's status row.
func TestWatchRunnerVersions(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	r := newFakeRunner()
	r.set("a", projection.Status{State: projection.StateRunning, Version: 1, ActiveVersion: 1, VersionState: projection.VersionRetired})
	r.set("b", projection.Status{State: projection.StateRunning, Version: 2, ActiveVersion: 1, VersionState: projection.VersionBuilding})
	require.NoError(t, m.WatchRunner(r))
	require.InDelta(t, 1, mustValue(t, reg, "nudge_projection_version", "projection", "a"), 0)
	require.InDelta(t, 2, mustValue(t, reg, "nudge_projection_version", "projection", "b"), 0)
	require.InDelta(t, 1, mustValue(t, reg, "nudge_projection_version_state", "projection", "a", "version_state", "retired"), 0)
	require.InDelta(t, 0, mustValue(t, reg, "nudge_projection_version_state", "projection", "a", "version_state", "active"), 0)
	require.InDelta(t, 1, mustValue(t, reg, "nudge_projection_version_state", "projection", "b", "version_state", "building"), 0)
	require.InDelta(t, 0, mustValue(t, reg, "nudge_projection_version_state", "projection", "b", "version_state", "retired"), 0)
}
