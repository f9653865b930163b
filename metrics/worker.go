package metrics

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nudgeworks/nudge/worker"
)

// StatsReader is what WatchWorker needs of a worker; *worker.Worker satisfies it.
type StatsReader interface {
	// Stats returns the counters of the named projection's handler.
	Stats(name string) worker.Stats
}

// WatchWorker registers a collector that exposes the worker's counters (worker.Stats) of the
// named projections as Prometheus counters, read at scrape time: nothing is counted twice.
//
// names are the worker's projections: runner.Names(), or worker.Config.Projections if you set
// it. They may be left out only if w has a Names() []string method. One worker per Metrics: a
// second call fails with an error matching ErrAlreadyRegistered.
func (m *Metrics) WatchWorker(w StatsReader, names ...string) error {
	if w == nil {
		return wrapInvalid("WatchWorker needs a worker, got nil")
	}
	if len(names) == 0 {
		if n, ok := w.(interface{ Names() []string }); ok {
			names = n.Names()
		}
	}
	if len(names) == 0 {
		return wrapInvalid("WatchWorker needs the worker's projection names: pass runner.Names()... " +
			"(or worker.Config.Projections if you set it)")
	}
	if err := checkNames("WatchWorker", names); err != nil {
		return err
	}
	c := &workerCollector{w: w, names: slices.Clone(names)}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(m.ns, "worker", name), help, []string{"projection"}, nil)
	}
	c.received = desc("triggers_received_total", "Triggers delivered to the projection's handler, redeliveries and retries included.")
	c.redundant = desc("triggers_redundant_total", "Triggers for positions or event types the projection had already passed; they cost no read.")
	c.ignored = desc("triggers_ignored_total", "Triggers addressed to another projection.")
	c.invalid = desc("triggers_invalid_total", "Triggers that could not be decoded; they are dead-lettered at once.")
	c.deadLettered = desc("triggers_dead_lettered_total", "Triggers handed to the dead letters.")
	c.healed = desc("dead_letters_healed_total", "Dead letters resolved as healed: the projection passed their failing event by itself (a transient failure).")
	c.stalls = desc("stalls_total", "Stalls the safety net found: readable events waited worker.Config.StallAfter with no trigger, or behind a stuck catch-up.")
	c.catchUps = desc("catchups_total", "Catch-ups run for triggers, at start-up and by the safety net.")
	c.failures = desc("catchup_failures_total", "Catch-ups that returned an error (a handler failure or an infrastructure error).")
	c.owned = desc("partitions_owned", "Partitions of a partitioned projection this worker owns now (0 for an unpartitioned projection).")
	c.claimed = desc("partitions_claimed_total", "Partitions this worker took over (its start, a rebalance, another worker's death).")
	c.givenBack = desc("partitions_given_back_total", "Partitions this worker gave back (a rebalance, its stop).")
	return m.register("WatchWorker's collector", c)
}

type workerCollector struct {
	w     StatsReader
	names []string

	received, redundant, ignored, invalid, deadLettered, healed, catchUps, failures, stalls *prometheus.Desc
	owned, claimed, givenBack                                                               *prometheus.Desc
}

// Describe implements prometheus.Collector.
func (c *workerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.received, c.redundant, c.ignored, c.invalid, c.deadLettered, c.healed, c.catchUps, c.failures, c.stalls,
		c.owned, c.claimed, c.givenBack} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *workerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, name := range c.names {
		s := c.w.Stats(name)
		for _, v := range []struct {
			desc *prometheus.Desc
			n    int64
		}{
			{c.received, s.Received}, {c.redundant, s.Redundant}, {c.ignored, s.Ignored}, {c.invalid, s.Invalid},
			{c.deadLettered, s.DeadLettered}, {c.healed, s.Healed}, {c.catchUps, s.CatchUps}, {c.failures, s.Failures}, {c.stalls, s.Stalls},
			{c.claimed, s.PartitionsClaimed}, {c.givenBack, s.PartitionsGivenBack},
		} {
			ch <- prometheus.MustNewConstMetric(v.desc, prometheus.CounterValue, float64(v.n), name)
		}
		ch <- prometheus.MustNewConstMetric(c.owned, prometheus.GaugeValue, float64(s.Partitions), name)
	}
}
