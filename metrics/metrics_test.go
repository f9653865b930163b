package metrics_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/metrics"
	"github.com/nudgeworks/nudge/projection"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pgx pools close asynchronously after the tests that own them.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
	)
}

// newMetrics returns Metrics on a new pedantic registry that query at every scrape.
func newMetrics(t testing.TB) (*metrics.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg, CacheTTL: -1, Logger: testlog.New(t)})
	require.NoError(t, err)
	return m, reg
}

// value gathers g and returns the value of the series name{labels} (pairs of label name and
// value; other labels may have any value): a counter's or gauge's value, a histogram's sample
// count. found is false when no such series was gathered.
func value(t testing.TB, g prometheus.Gatherer, name string, labels ...string) (v float64, found bool) {
	t.Helper()
	require.Zero(t, len(labels)%2, "labels come in pairs")
	families, err := g.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, s := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range s.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue series
				}
			}
			require.False(t, found, "%s%v matches more than one series", name, labels)
			found = true
			switch {
			case s.Counter != nil:
				v = s.GetCounter().GetValue()
			case s.Gauge != nil:
				v = s.GetGauge().GetValue()
			case s.Histogram != nil:
				v = float64(s.GetHistogram().GetSampleCount())
			default:
				t.Fatalf("%s: unexpected metric type %s", name, f.GetType())
			}
		}
	}
	return v, found
}

// mustValue is value for a series that must exist.
func mustValue(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, ok := value(t, g, name, labels...)
	require.True(t, ok, "no series %s%v", name, labels)
	return v
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]metrics.Config{
		"no registerer":     {},
		"bad namespace":     {Registerer: prometheus.NewRegistry(), Namespace: "nudge-prod"},
		"unsorted buckets":  {Registerer: prometheus.NewRegistry(), BatchDurationBuckets: []float64{1, 0.5}},
		"repeated buckets":  {Registerer: prometheus.NewRegistry(), BatchDurationBuckets: []float64{1, 1}},
		"negative timeout":  {Registerer: prometheus.NewRegistry(), QueryTimeout: -time.Second},
		"digit first in ns": {Registerer: prometheus.NewRegistry(), Namespace: "1nudge"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := metrics.New(cfg)
			require.ErrorIs(t, err, metrics.ErrInvalidConfig)
		})
	}
}

// TestNewTwiceOnOneRegistry: the second New on one registry and namespace is refused with both
// our sentinel and Prometheus's AlreadyRegisteredError; another namespace is fine.
func TestNewTwiceOnOneRegistry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	_, err := metrics.New(metrics.Config{Registerer: reg})
	require.NoError(t, err)
	_, err = metrics.New(metrics.Config{Registerer: reg})
	require.ErrorIs(t, err, metrics.ErrAlreadyRegistered)
	var are prometheus.AlreadyRegisteredError
	require.ErrorAs(t, err, &are)
	require.Contains(t, err.Error(), `namespace "nudge"`)

	_, err = metrics.New(metrics.Config{Registerer: reg, Namespace: "other"})
	require.NoError(t, err)
}

// TestNewLeavesNothingBehindOnError: when a later collector is refused, the ones New had
// already registered are unregistered again.
func TestNewLeavesNothingBehindOnError(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	// Squat the name of New's last collector with other labels.
	squatter := prometheus.NewCounter(prometheus.CounterOpts{Name: "nudge_projection_handler_failures_total", Help: "squatter"})
	reg.MustRegister(squatter)
	_, err := metrics.New(metrics.Config{Registerer: reg})
	require.Error(t, err)
	require.NotErrorIs(t, err, metrics.ErrAlreadyRegistered, "a conflict, not a repeat")
	require.Contains(t, err.Error(), "nudge_projection_handler_failures_total")

	// New registered events_projected_total before it met the squatter: it must be gone.
	err = reg.Register(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nudge_projection_events_projected_total",
		Help: "Events handled and committed by the projection's batches in this process.",
	}, []string{"projection"}))
	require.NoError(t, err, "the failed New left its first collector registered")
}

// TestObserveBatch: each kind of batch report lands in the right series, exactly.
func TestObserveBatch(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	m.ObserveBatch(projection.BatchReport{Projection: "a", Events: 7, Took: 3 * time.Millisecond})
	m.ObserveBatch(projection.BatchReport{Projection: "a", Events: 2, Took: 40 * time.Millisecond})
	m.ObserveBatch(projection.BatchReport{Projection: "a", Took: 2 * time.Second,
		Err: &projection.HandlerError{Projection: "a", Event: eventstore.EventRef{ID: uuid.New(), Type: "Poison"}, Err: errors.New("boom")}})
	m.ObserveBatch(projection.BatchReport{Projection: "a", Took: 20 * time.Second, Err: fmt.Errorf("wrapped: %w", projection.ErrHandler)})
	m.ObserveBatch(projection.BatchReport{Projection: "b", Took: time.Millisecond, Err: errors.New("connection refused")})

	expected := `
# HELP nudge_projection_batches_total Projection batches run in this process, by outcome: committed, failed (a handler failed) or error (the batch could not run).
# TYPE nudge_projection_batches_total counter
nudge_projection_batches_total{outcome="committed",projection="a"} 2
nudge_projection_batches_total{outcome="failed",projection="a"} 2
nudge_projection_batches_total{outcome="error",projection="b"} 1
# HELP nudge_projection_events_projected_total Events handled and committed by the projection's batches in this process.
# TYPE nudge_projection_events_projected_total counter
nudge_projection_events_projected_total{projection="a"} 9
# HELP nudge_projection_handler_failures_total Batches rolled back because a handler failed, by the type of the event it failed on.
# TYPE nudge_projection_handler_failures_total counter
nudge_projection_handler_failures_total{event_type="",projection="a"} 1
nudge_projection_handler_failures_total{event_type="Poison",projection="a"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected),
		"nudge_projection_batches_total", "nudge_projection_events_projected_total", "nudge_projection_handler_failures_total"))

	require.Equal(t, 4.0, mustValue(t, reg, "nudge_projection_batch_duration_seconds", "projection", "a"), "every outcome is timed")
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "nudge_projection_batch_duration_seconds" {
			continue
		}
		for _, s := range f.GetMetric() {
			if s.GetLabel()[0].GetValue() != "a" {
				continue
			}
			h := s.GetHistogram()
			require.InDelta(t, 22.043, h.GetSampleSum(), 1e-9)
			buckets := map[float64]uint64{}
			for _, b := range h.GetBucket() {
				buckets[b.GetUpperBound()] = b.GetCumulativeCount()
			}
			require.Equal(t, uint64(0), buckets[0.001])
			require.Equal(t, uint64(1), buckets[0.005], "3 ms")
			require.Equal(t, uint64(2), buckets[0.05], "40 ms")
			require.Equal(t, uint64(3), buckets[2.5], "2 s")
			require.Equal(t, uint64(3), buckets[10], "20 s is above the last bucket")
		}
	}
}

// TestObserveCatchUp: a building version's waits add up per projection; a catch-up that did
// not wait adds no series.
func TestObserveCatchUp(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	m.ObserveCatchUp("a.v2", projection.Result{Paced: 1500 * time.Millisecond}, nil)
	m.ObserveCatchUp("a.v2", projection.Result{Paced: 500 * time.Millisecond}, errors.New("cancelled"))
	m.ObserveCatchUp("b", projection.Result{Events: 5}, nil)
	expected := `
# HELP nudge_projection_build_paced_seconds_total Time a version built beside the active one waited between its batches for the active version's lag (Config.BuildLagTarget).
# TYPE nudge_projection_build_paced_seconds_total counter
nudge_projection_build_paced_seconds_total{projection="a.v2"} 2
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected), "nudge_projection_build_paced_seconds_total"))
}

// TestNamespace: every metric takes the configured namespace.
func TestNamespace(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg, Namespace: "shop"})
	require.NoError(t, err)
	m.ObserveBatch(projection.BatchReport{Projection: "a", Events: 1})
	require.Equal(t, 1.0, mustValue(t, reg, "shop_projection_events_projected_total", "projection", "a"))
	_, found := value(t, reg, "nudge_projection_events_projected_total")
	require.False(t, found)
}
