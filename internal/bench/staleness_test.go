package main

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/projection"
)

// TestHistogramQuantile: the rank's bucket, interpolated linearly as Prometheus does; the
// first bucket from 0; a rank in +Inf gives the largest finite bound.
func TestHistogramQuantile(t *testing.T) {
	t.Parallel()
	inf := math.Inf(1)
	h := bucketCounts{bounds: []float64{0.1, 0.2, 0.4, inf}, counts: []uint64{10, 60, 100, 100}}
	require.InDelta(t, 0.05, histogramQuantile(0.05, h), 1e-12, "half of the first bucket, from 0")
	require.InDelta(t, 0.18, histogramQuantile(0.5, h), 1e-12, "40 of the 50 in (0.1, 0.2]")
	require.InDelta(t, 0.395, histogramQuantile(0.99, h), 1e-12, "39 of the 40 in (0.2, 0.4]")
	require.InDelta(t, 0.1, histogramQuantile(0.1, h), 1e-12, "a rank on a bound")
	require.InDelta(t, 0.4, histogramQuantile(0.99, bucketCounts{bounds: h.bounds, counts: []uint64{0, 0, 1, 10}}), 1e-12)
	require.True(t, math.IsNaN(histogramQuantile(0.5, bucketCounts{bounds: h.bounds, counts: []uint64{0, 0, 0, 0}})))
}

// TestStalenessProbe: the summary counts only what was observed after mark, in the named
// projections, and reads quantiles within the bucket of the samples.
func TestStalenessProbe(t *testing.T) {
	t.Parallel()
	p, err := newStalenessProbe()
	require.NoError(t, err)
	p.observe(projection.BatchReport{Projection: "a", Events: 1, Staleness: []time.Duration{time.Minute}})
	require.NoError(t, p.mark())
	many := make([]time.Duration, 100)
	for i := range many {
		many[i] = 3 * time.Millisecond // in (2 ms, 4 ms]
	}
	p.observe(projection.BatchReport{Projection: "a", Events: 100, Staleness: many})
	p.observe(projection.BatchReport{Projection: "slow", Events: 1, Staleness: []time.Duration{time.Second}})
	s, err := p.summary([]string{"a"})
	require.NoError(t, err)
	require.Equal(t, uint64(100), s.Count)
	require.InDelta(t, 0.003, s.P50.Seconds(), 1e-6, "half of the (2 ms, 4 ms] bucket")
	require.InDelta(t, 0.00398, s.P99.Seconds(), 1e-6)
}

// TestWithinResolution: agreement is a difference of at most the measured value's bucket width.
func TestWithinResolution(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	require.True(t, withinResolution(118*ms, 124*ms), "(64, 128] ms is 64 ms wide")
	require.True(t, withinResolution(669*ms, 987*ms), "(512, 1024] ms is 512 ms wide")
	require.False(t, withinResolution(100*ms, 200*ms))
	require.True(t, withinResolution(500*time.Microsecond, 900*time.Microsecond), "the first bucket, 1 ms")
}
