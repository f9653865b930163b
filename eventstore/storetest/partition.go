package storetest

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
)

// partitionHeader is implemented by stores that tell the head of one partition (both stores
// of this module do).
type partitionHeader interface {
	HeadPartition(ctx context.Context, p eventstore.Partition) (eventstore.Position, error)
}

// testPartitions: each partition's read returns exactly the events of its streams, in read
// order, page after page; the partitions together are the whole log, each event in one; the
// type filter and OmitPayload combine with the partition.
func testPartitions(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	const streams, rounds, count = 24, 5, 4
	var last eventstore.Position
	for r := range rounds {
		for i := range streams {
			typ := []string{"A", "B", "C"}[(i+r)%3]
			res, err := s.Append(ctx, fmt.Sprintf("part-%02d", i), eventstore.Any, Event(typ, r), Event("B", r))
			require.NoError(t, err)
			last = res.Last()
		}
	}
	Settle(t, s, last)
	all := ReadAll(t, s, eventstore.ReadOptions{Limit: 50})
	require.Len(t, all, streams*rounds*2)

	seen := make(map[eventstore.Position]int)
	for i := range count {
		p := eventstore.Partition{Index: i, Count: count}
		var want []eventstore.Event
		for _, e := range all {
			if eventstore.PartitionOf(e.StreamID, count) == i {
				want = append(want, e)
			}
		}
		require.NotEmpty(t, want, "partition %s has streams", p)
		got := ReadAll(t, s, eventstore.ReadOptions{Limit: 7, Partition: p})
		require.Equal(t, want, got, "partition %s: its streams' events, in read order", p)
		for _, e := range got {
			seen[e.Position]++
		}

		var wantC []eventstore.Position
		for _, e := range want {
			if e.Type == "C" {
				wantC = append(wantC, e.Position)
			}
		}
		bare := ReadAll(t, s, eventstore.ReadOptions{Limit: 3, Partition: p, Types: []string{"C"}, OmitPayload: true})
		require.Equal(t, wantC, positions(bare), "partition %s, type C", p)
		for _, e := range bare {
			require.Nil(t, e.Payload)
		}

		if h, ok := s.(partitionHeader); ok {
			head, err := h.HeadPartition(ctx, p)
			require.NoError(t, err)
			wantHead := eventstore.Position{}
			if len(want) > 0 {
				wantHead = want[len(want)-1].Position
			}
			require.Equal(t, wantHead, head, "head of partition %s", p)
		}
	}
	require.Len(t, seen, len(all), "the partitions together are the whole log")
	for pos, n := range seen {
		require.Equal(t, 1, n, "event %s read in %d partitions", pos, n)
	}

	one := ReadAll(t, s, eventstore.ReadOptions{Limit: 50, Partition: eventstore.Partition{Count: 1}})
	require.Equal(t, all, one, "one partition is the whole log")
	if h, ok := s.(partitionHeader); ok {
		head, err := h.HeadPartition(ctx, eventstore.Partition{})
		require.NoError(t, err)
		require.Equal(t, all[len(all)-1].Position, head)
	}
}

// testBadPartition: a Partition out of range is refused with a *ValidationError naming it.
func testBadPartition(t *testing.T, s eventstore.Store) {
	ctx := context.Background()
	for _, p := range []eventstore.Partition{
		{Index: 4, Count: 4}, {Index: -1, Count: 4}, {Count: -1}, {Count: eventstore.MaxPartitions + 1},
		{Index: 1, Count: 0}, {Index: 1, Count: 1},
	} {
		_, err := s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{Partition: p})
		require.ErrorIs(t, err, eventstore.ErrInvalidInput, "%+v", p)
		var verr *eventstore.ValidationError
		require.ErrorAs(t, err, &verr, "%+v", p)
		require.Contains(t, []string{"Partition.Index", "Partition.Count"}, verr.Field, "%+v", p)
		if h, ok := s.(partitionHeader); ok {
			_, err := h.HeadPartition(ctx, p)
			require.ErrorAs(t, err, &verr, "%+v", p)
		}
	}
	_, err := s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{Partition: eventstore.Partition{Index: eventstore.MaxPartitions - 1, Count: eventstore.MaxPartitions}})
	require.NoError(t, err, "the largest partition count is valid")
}

func positions(events []eventstore.Event) []eventstore.Position {
	var out []eventstore.Position
	for _, e := range events {
		out = append(out, e.Position)
	}
	return out
}
