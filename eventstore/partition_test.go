package eventstore_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
)

// TestPartitionOf pins partitions to values PostgreSQL computes with
// ((('x' || substr(md5(s), 1, 8))::bit(32)::int & 2147483647) % n): a stream's partition must
// never move between versions.
func TestPartitionOf(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]struct {
		hash      int32 // ('x' || substr(md5(s), 1, 8))::bit(32)::int
		partition int   // among 16
	}{
		"ticket-1":  {-1820146447, 1},
		"order-42":  {1329687308, 12},
		"Ünïcødé-流": {-728807610, 6},
		"a":         {214005177, 9},
	} {
		for _, n := range []int{2, 16, 1000, 1024} {
			require.Equal(t, int(want.hash&0x7fffffff)%n, eventstore.PartitionOf(id, n), "%s among %d", id, n)
		}
		require.Equal(t, want.partition, eventstore.PartitionOf(id, 16), id)
		require.True(t, eventstore.Partition{Index: want.partition, Count: 16}.Contains(id), id)
		require.Zero(t, eventstore.PartitionOf(id, 1), "one partition")
		require.Zero(t, eventstore.PartitionOf(id, 0), "unpartitioned")
		require.True(t, eventstore.Partition{}.Contains(id), "the whole log holds every stream")
		key := eventstore.PartitionKey(id)
		require.Equal(t, uint32(want.hash&0x7fffffff), key, id)
		for _, n := range []int{2, 16, 1000, 1024} {
			p := eventstore.Partition{Index: eventstore.PartitionOf(id, n), Count: n}
			require.True(t, p.ContainsKey(key), "%s among %d", id, n)
			require.False(t, eventstore.Partition{Index: (p.Index + 1) % n, Count: n}.ContainsKey(key), "%s among %d", id, n)
		}
		require.True(t, eventstore.Partition{}.ContainsKey(key), "the whole log holds every key")
	}
}

// TestPartitionSpread: stream ids spread evenly over the partitions.
func TestPartitionSpread(t *testing.T) {
	t.Parallel()
	const streams, count = 16_000, 16
	var per [count]int
	for i := range streams {
		per[eventstore.PartitionOf(fmt.Sprintf("ticket-%d", i), count)]++
	}
	for i, n := range per {
		require.InDelta(t, streams/count, n, streams/count/5, "partition %d holds %d streams", i, n)
	}
}

// TestPartitionValidate: counts 0 to MaxPartitions are valid with an index in range; the rest
// are refused with a *ValidationError naming the field.
func TestPartitionValidate(t *testing.T) {
	t.Parallel()
	for _, p := range []eventstore.Partition{{}, {Count: 1}, {Index: 15, Count: 16}, {Index: 1023, Count: eventstore.MaxPartitions}} {
		require.NoError(t, p.Validate(), "%+v", p)
	}
	for p, field := range map[eventstore.Partition]string{
		{Count: -1}:                           "Partition.Count",
		{Count: eventstore.MaxPartitions + 1}: "Partition.Count",
		{Index: 16, Count: 16}:                "Partition.Index",
		{Index: -1, Count: 16}:                "Partition.Index",
		{Index: 1}:                            "Partition.Index",
	} {
		err := p.Validate()
		require.ErrorIs(t, err, eventstore.ErrInvalidInput, "%+v", p)
		var verr *eventstore.ValidationError
		require.ErrorAs(t, err, &verr)
		require.Equal(t, field, verr.Field, "%+v", p)
	}
	require.Equal(t, "3/16", eventstore.Partition{Index: 3, Count: 16}.String())
	require.Equal(t, "all", eventstore.Partition{Count: 1}.String())
	require.False(t, eventstore.Partition{Count: 1}.Partitioned())
	require.True(t, eventstore.Partition{Count: 2}.Partitioned())
}

// TestPartitionOverlapping: the partitions of another count that Overlapping names hold every
// stream of the partition, and each of them holds some.
func TestPartitionOverlapping(t *testing.T) {
	for _, c := range []struct{ from, to int }{{1, 4}, {4, 1}, {4, 8}, {8, 4}, {6, 4}, {3, 5}, {16, 16}, {0, 3}} {
		for index := range max(c.from, 1) {
			p := eventstore.Partition{Index: index, Count: c.from}
			want := p.Overlapping(c.to)
			reached := make(map[int]bool)
			for i := range 4000 {
				s := fmt.Sprintf("stream-%d", i)
				if !p.Contains(s) {
					continue
				}
				k := eventstore.PartitionOf(s, max(c.to, 1))
				require.Contains(t, want, k, "stream %s of %s is in partition %d of %d", s, p, k, c.to)
				reached[k] = true
			}
			require.Len(t, reached, len(want), "every partition of %d that %s overlaps holds some of its streams", c.to, p)
		}
	}
}
