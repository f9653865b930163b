package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBlueGreenCountsOnlyTheLiveEventsAppendedDuringTheBuild(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 11, 28, 1, 0, 0, 0, time.UTC)
	res := bgResult{started: start, took: 10 * time.Second}
	samples := []liveSample{
		{appended: start.Add(-time.Millisecond), latency: 1 * time.Millisecond},  // before the build
		{appended: start, latency: 2 * time.Millisecond},                         // at its start
		{appended: start.Add(5 * time.Second), latency: 3 * time.Millisecond},    // during
		{appended: start.Add(10 * time.Second), latency: 4 * time.Millisecond},   // at its cut-over
		{appended: start.Add(10*time.Second + 1), latency: 5 * time.Millisecond}, // after
		{appended: start.Add(time.Hour), latency: 6 * time.Millisecond},          // long after
	}
	require.Equal(t, []time.Duration{2 * time.Millisecond, 3 * time.Millisecond, 4 * time.Millisecond}, res.during(samples))
}

func TestBlueGreenBoundsThePacedBuildOnly(t *testing.T) {
	t.Parallel()
	for _, quick := range []bool{true, false} {
		h := &harness{sizes: sizesFor(quick)}
		builds := h.bgBuilds()
		require.Len(t, builds, 2)
		require.Positive(t, builds[0].window, "the paced build is bounded (quick %v)", quick)
		require.Zero(t, builds[0].target, "the paced build uses the default BuildLagTarget (quick %v)", quick)
		require.Negative(t, builds[1].target, "the second build runs at full speed (quick %v)", quick)
		require.Zero(t, builds[1].window, "the full-speed build runs to its cut-over (quick %v)", quick)
	}
}
