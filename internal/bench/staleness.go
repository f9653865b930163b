package main

import (
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/nudgeworks/nudge/metrics"
	"github.com/nudgeworks/nudge/projection"
)

// stalenessProbe feeds a live run's batch reports to package metrics, as a user's worker
// does, and reads its staleness histogram back: the quantiles a Prometheus query would show,
// to set beside the run's own end-to-end measurement.
type stalenessProbe struct {
	m   *metrics.Metrics
	reg *prometheus.Registry

	mu     sync.Mutex
	before map[string]bucketCounts // per projection, at mark
}

// bucketCounts are a histogram's cumulative bucket counts and their upper bounds (+Inf last).
type bucketCounts struct {
	bounds []float64
	counts []uint64
}

func newStalenessProbe() (*stalenessProbe, error) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg})
	if err != nil {
		return nil, err
	}
	return &stalenessProbe{m: m, reg: reg}, nil
}

// observe records a batch (projection.RunnerConfig.OnBatch).
func (p *stalenessProbe) observe(b projection.BatchReport) { p.m.ObserveBatch(b) }

// mark notes the histogram as it is now: summary counts only what is observed after.
func (p *stalenessProbe) mark() error {
	now, err := p.gather()
	p.mu.Lock()
	p.before = now
	p.mu.Unlock()
	return err
}

// gather returns the staleness histogram of every projection.
func (p *stalenessProbe) gather() (map[string]bucketCounts, error) {
	families, err := p.reg.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]bucketCounts{}
	for _, f := range families {
		if f.GetName() != "nudge_projection_event_staleness_seconds" {
			continue
		}
		for _, s := range f.GetMetric() {
			out[projectionLabel(s)] = countsOf(s.GetHistogram())
		}
	}
	return out, nil
}

func projectionLabel(s *dto.Metric) string {
	for _, l := range s.GetLabel() {
		if l.GetName() == "projection" {
			return l.GetValue()
		}
	}
	return ""
}

func countsOf(h *dto.Histogram) bucketCounts {
	var c bucketCounts
	for _, b := range h.GetBucket() {
		c.bounds = append(c.bounds, b.GetUpperBound())
		c.counts = append(c.counts, b.GetCumulativeCount())
	}
	c.bounds = append(c.bounds, math.Inf(1))
	c.counts = append(c.counts, h.GetSampleCount())
	return c
}

// stalenessSummary is the staleness histogram of a run's measured projections since mark,
// summed over them (sum by (le)), read as Prometheus's histogram_quantile reads it.
type stalenessSummary struct {
	Count    uint64
	P50, P99 time.Duration
}

// summary sums the histograms of names since mark and returns their p50 and p99.
func (p *stalenessProbe) summary(names []string) (stalenessSummary, error) {
	now, err := p.gather()
	if err != nil {
		return stalenessSummary{}, err
	}
	p.mu.Lock()
	before := p.before
	p.mu.Unlock()
	var sum bucketCounts
	for _, name := range names {
		h, ok := now[name]
		if !ok {
			continue
		}
		if sum.bounds == nil {
			sum = bucketCounts{bounds: slices.Clone(h.bounds), counts: make([]uint64, len(h.counts))}
		}
		was := before[name]
		for i := range h.counts {
			sum.counts[i] += h.counts[i]
			if i < len(was.counts) {
				sum.counts[i] -= was.counts[i]
			}
		}
	}
	if len(sum.counts) == 0 {
		return stalenessSummary{}, nil
	}
	return stalenessSummary{
		Count: sum.counts[len(sum.counts)-1],
		P50:   seconds(histogramQuantile(0.50, sum)),
		P99:   seconds(histogramQuantile(0.99, sum)),
	}, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// histogramQuantile is Prometheus's histogram_quantile on cumulative buckets: the bucket that
// holds the q-quantile's rank, interpolated linearly within it (from 0 for the first bucket);
// a rank in the +Inf bucket gives the largest finite bound. NaN for no samples.
func histogramQuantile(q float64, h bucketCounts) float64 {
	n := len(h.counts)
	if n == 0 || h.counts[n-1] == 0 {
		return math.NaN()
	}
	rank := q * float64(h.counts[n-1])
	i, _ := slices.BinarySearchFunc(h.counts, rank, func(c uint64, r float64) int {
		switch {
		case float64(c) < r:
			return -1
		case float64(c) > r:
			return 1
		}
		return 0
	})
	if i == n-1 {
		return h.bounds[n-2]
	}
	lower, below := 0.0, uint64(0)
	if i > 0 {
		lower, below = h.bounds[i-1], h.counts[i-1]
	}
	inBucket := h.counts[i] - below
	if inBucket == 0 {
		return h.bounds[i]
	}
	return lower + (h.bounds[i]-lower)*(rank-float64(below))/float64(inBucket)
}

// withinResolution reports whether the histogram's quantile hist agrees with the measured one
// within the histogram's resolution: they differ by at most the width of the default bucket
// that holds measured (buckets double from 1 ms, so (u/2, u] is u/2 wide).
func withinResolution(measured, hist time.Duration) bool {
	upper := time.Millisecond
	for upper < measured {
		upper *= 2
	}
	diff := max(measured-hist, hist-measured)
	return diff <= upper/2
}
