package metrics

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nudgeworks/nudge/projection"
)

// StatusReader is what WatchRunner needs of a runner; *projection.Runner satisfies it.
type StatusReader interface {
	// Names returns the projection names.
	Names() []string
	// Status returns one projection's status and lag.
	Status(ctx context.Context, name string) (projection.Status, error)
}

// WatchRunner registers a collector that reads the status of each of the runner's
// projections at scrape time (see the package documentation): lag in events and seconds,
// state and whether the xmin horizon holds the projection back. It also creates the
// projections' batch series at zero. One runner per Metrics: a second call fails with an
// error matching ErrAlreadyRegistered.
func (m *Metrics) WatchRunner(r StatusReader) error {
	if r == nil {
		return wrapInvalid("WatchRunner needs a runner, got nil")
	}
	names := r.Names()
	if err := checkNames("WatchRunner", names); err != nil {
		return err
	}
	c := &runnerCollector{names: slices.Clone(names), partitions: partitionCounts(r, names)}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(m.ns, "projection", name), help, append([]string{"projection"}, labels...), nil)
	}
	c.lagEvents = desc("lag_events", "Readable events of the projection's types after its committed position.")
	c.lagSeconds = desc("lag_seconds", "Age of the oldest readable event the projection has not handled; 0 when caught up.")
	c.state = desc("state", "The projection's state: 1 for the current one, 0 for the others.", "state")
	c.condition = desc("condition", "The projection's one condition (caught_up, working, held, failing, paused, rebuilding, retired): 1 for the current one, 0 for the others.", "condition")
	c.holderAge = desc("horizon_holder_age_seconds",
		"How long the open transaction that holds the projection back has been open (nudge horizon names it); 0 when not held or not visible.")
	c.held = desc("held_by_horizon",
		"1 while committed events of the projection's types wait behind an older open transaction (the projection waits, it never skips).")
	c.parked = desc("parked_streams", "Streams the projection parked (OnFailure park) and holds until a redrive.")
	c.parkedAge = desc("oldest_parked_seconds", "How long the projection's oldest parked stream has been parked; 0 when none is.")
	c.version = desc("version", "The version of the projection's read model the status row belongs to (Config.Version; its own row per version).")
	c.versionState = desc("version_state",
		"Where this version stands: 1 for the current one of active (readers see it), building (beside the active one) and retired, 0 for the others.",
		"version_state")
	c.partitionsDesc = desc("partitions",
		"Partitions of a partitioned projection (Config.Partitions), 0 for an unpartitioned one: compare with the sum of nudge_worker_partitions_owned.")
	c.query = newQuery(m, SourceStatus, func(ctx context.Context) ([]projection.Status, int) {
		out := make([]projection.Status, 0, len(c.names))
		failed := 0
		for _, name := range c.names {
			st, err := r.Status(ctx, name)
			if err != nil {
				failed++
				m.logger.WarnContext(ctx, "metrics: reading a projection's status failed; its gauges are left out of this scrape",
					slog.String("projection", name), slog.Any("error", err))
				continue
			}
			st.Name = name
			out = append(out, st)
		}
		return out, failed
	})
	if err := m.register("WatchRunner's collector", c); err != nil {
		return err
	}
	m.initBatchSeries(names)
	return nil
}

type runnerCollector struct {
	names                              []string
	lagEvents, lagSeconds, state, held *prometheus.Desc
	condition, holderAge               *prometheus.Desc
	parked, parkedAge                  *prometheus.Desc
	version, versionState              *prometheus.Desc
	partitionsDesc                     *prometheus.Desc
	partitions                         []int
	query                              *query[[]projection.Status]
}

// Describe implements prometheus.Collector.
func (c *runnerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.lagEvents
	ch <- c.lagSeconds
	ch <- c.state
	ch <- c.held
	ch <- c.condition
	ch <- c.holderAge
	ch <- c.parked
	ch <- c.parkedAge
	ch <- c.version
	ch <- c.versionState
	ch <- c.partitionsDesc
	c.query.describe(ch)
}

// Collect implements prometheus.Collector.
func (c *runnerCollector) Collect(ch chan<- prometheus.Metric) {
	for i, name := range c.names {
		ch <- prometheus.MustNewConstMetric(c.partitionsDesc, prometheus.GaugeValue, float64(c.partitions[i]), name)
	}
	for _, st := range c.query.get(ch) {
		ch <- prometheus.MustNewConstMetric(c.lagEvents, prometheus.GaugeValue, float64(st.LagEvents), st.Name)
		ch <- prometheus.MustNewConstMetric(c.lagSeconds, prometheus.GaugeValue, st.LagTime.Seconds(), st.Name)
		ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, boolValue(st.HeldByHorizon), st.Name)
		var age time.Duration
		if st.Holder != nil {
			age = st.Holder.Age
		}
		ch <- prometheus.MustNewConstMetric(c.holderAge, prometheus.GaugeValue, age.Seconds(), st.Name)
		ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, float64(st.ParkedStreams), st.Name)
		var parkedAge time.Duration
		if !st.OldestParkedAt.IsZero() {
			parkedAge = max(time.Since(st.OldestParkedAt), 0)
		}
		ch <- prometheus.MustNewConstMetric(c.parkedAge, prometheus.GaugeValue, parkedAge.Seconds(), st.Name)
		ch <- prometheus.MustNewConstMetric(c.version, prometheus.GaugeValue, float64(max(st.Version, 1)), st.Name)
		if st.VersionState != "" {
			for _, v := range projection.VersionStates() {
				ch <- prometheus.MustNewConstMetric(c.versionState, prometheus.GaugeValue, boolValue(v == st.VersionState), st.Name, string(v))
			}
		}
		for _, k := range projection.Conditions() {
			ch <- prometheus.MustNewConstMetric(c.condition, prometheus.GaugeValue, boolValue(k == st.Condition()), st.Name, string(k))
		}
		states := projection.States()
		if !slices.Contains(states, st.State) {
			states = append(states, st.State) // a state newer than this package: still shown
		}
		for _, s := range states {
			ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, boolValue(s == st.State), st.Name, string(s))
		}
	}
}

// partitionCounts returns the number of partitions of each named projection, 0 for an
// unpartitioned one or when r does not say (it has no Partitions method, as *projection.Runner
// has).
func partitionCounts(r StatusReader, names []string) []int {
	out := make([]int, len(names))
	pr, ok := r.(interface {
		Partitions(name string) ([]string, error)
	})
	if !ok {
		return out
	}
	for i, name := range names {
		if units, err := pr.Partitions(name); err == nil && len(units) > 1 {
			out[i] = len(units)
		}
	}
	return out
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
