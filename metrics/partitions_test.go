package metrics_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// partitionedRunner is a fakeRunner whose projection "a" has four partitions.
type partitionedRunner struct{ *fakeRunner }

func (partitionedRunner) Partitions(name string) ([]string, error) {
	if name == "a" {
		return []string{"a.p0", "a.p1", "a.p2", "a.p3"}, nil
	}
	return []string{name}, nil
}

// TestWatchRunnerExposesPartitions: nudge_projection_partitions is the partition count of a
// partitioned projection and 0 for an unpartitioned one, so that an alert can compare it with
// the partitions the workers own.
func TestWatchRunnerExposesPartitions(t *testing.T) {
	t.Parallel()
	m, g := newMetrics(t)
	require.NoError(t, m.WatchRunner(partitionedRunner{newFakeRunner()}))
	require.Equal(t, 4.0, mustValue(t, g, "nudge_projection_partitions", "projection", "a"))
	require.Equal(t, 0.0, mustValue(t, g, "nudge_projection_partitions", "projection", "b"))
}
