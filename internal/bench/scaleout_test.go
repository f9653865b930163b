package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
)

func TestPartitionSizesMatchTheLoadLayout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ n, streams, count int }{{0, 10, 4}, {5, 10, 4}, {25, 10, 4}, {10_000, 1000, 16}, {2001, 300, 7}} {
		// eventload: event i is on stream i%streams.
		want := make([]int, tc.count)
		for i := range tc.n {
			want[eventstore.PartitionOf(eventloadStream(i%tc.streams), tc.count)]++
		}
		require.Equal(t, want, partitionSizes(tc.n, tc.streams, tc.count), "%+v", tc)
	}
}

func TestScaleOutCaseLabels(t *testing.T) {
	t.Parallel()
	require.Equal(t, "unpartitioned, 1 worker", scaleOutCase{partitions: 1, workers: 1}.label())
	require.Equal(t, "16 partitions, 4 workers", scaleOutCase{partitions: 16, workers: 4}.label())
	require.Equal(t, "16 partitions, Runner.CatchUp (one partition after another)", scaleOutCase{partitions: 16}.label())
	require.Equal(t, 2*time.Second, medianDuration([]time.Duration{3 * time.Second, time.Second, 2 * time.Second}))
}
