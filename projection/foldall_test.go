package projection_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
)

// TestFoldPartitioned: partitions fold into their projection's status, in index order
// whatever order they came in; other statuses stay; the result is sorted by name.
func TestFoldPartitioned(t *testing.T) {
	t.Parallel()
	part := func(i int, st projection.State, lag int64) projection.Status {
		return projection.Status{Name: "orders.p" + string(rune('0'+i)), PartitionOf: "orders", State: st, LagEvents: lag,
			Partition: eventstore.Partition{Index: i, Count: 2}}
	}
	all := []projection.Status{{Name: "zeta"}, part(1, projection.StateFailing, 3), {Name: "alpha"}, part(0, projection.StateRunning, 2)}
	got := projection.FoldPartitioned(all)
	require.Len(t, got, 3)
	require.Equal(t, []string{"alpha", "orders", "zeta"}, []string{got[0].Name, got[1].Name, got[2].Name})
	orders := got[1]
	require.Equal(t, projection.StateFailing, orders.State, "the worst state")
	require.EqualValues(t, 5, orders.LagEvents, "lags summed")
	require.Len(t, orders.Partitions, 2)
	require.Equal(t, 0, orders.Partitions[0].Partition.Index, "in index order")
}
