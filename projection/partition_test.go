package projection_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	memstore "github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/memory"
)

// TestPartitionConfig: Config.Partitions defaults to 1 (the projection is its own unit), is
// refused out of range and beside a Version above 1; a partitioned projection's units are
// named by PartitionUnitName and read their partition of the log.
func TestPartitionConfig(t *testing.T) {
	t.Parallel()
	noop := projection.OnIdempotent("A", func(context.Context, projection.Event[struct{}]) error { return nil })
	plain, err := projection.New("orders", projection.Config{}, noop)
	require.NoError(t, err)
	require.Equal(t, 1, plain.Partitions())
	require.False(t, plain.Partitioned())
	require.Equal(t, []*projection.Projection{plain}, plain.Units())
	require.Equal(t, eventstore.Partition{}, plain.Partition())
	require.Same(t, plain, plain.Definition())

	for name, bad := range map[string]projection.Config{
		"Partitions -1":   {Partitions: -1},
		"Partitions 1025": {Partitions: eventstore.MaxPartitions + 1},
	} {
		_, err := projection.New("orders", bad, noop)
		require.ErrorIs(t, err, projection.ErrInvalidConfig, name)
		require.ErrorContains(t, err, "Partitions", name)
	}

	v2, err := projection.New("orders", projection.Config{Partitions: 4, Version: 2}, noop)
	require.NoError(t, err, "a partitioned projection has versions")
	require.Equal(t, "orders.v2.p3", v2.Units()[3].Name())

	p, err := projection.New("orders", projection.Config{Partitions: 16}, noop)
	require.NoError(t, err)
	require.True(t, p.Partitioned())
	units := p.Units()
	require.Len(t, units, 16)
	require.Equal(t, "orders.p00", units[0].Name())
	require.Equal(t, "orders.p15", units[15].Name())
	require.Equal(t, eventstore.Partition{Index: 7, Count: 16}, units[7].Partition())
	require.Same(t, p, units[7].Definition())
	require.Equal(t, "orders", units[7].Base())

	for _, tc := range []struct {
		index, count int
		want         string
	}{{0, 2, "x.p0"}, {9, 10, "x.p9"}, {10, 11, "x.p10"}, {3, 100, "x.p03"}, {1023, 1024, "x.p1023"}} {
		got, err := projection.PartitionUnitName("x", tc.index, tc.count)
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
	}
	_, err = projection.PartitionUnitName("x", 4, 4)
	require.ErrorIs(t, err, eventstore.ErrInvalidInput)
	long := "a123456789b123456789c123456789d123456789e123456789f123456789"
	_, err = projection.New(long, projection.Config{Partitions: 100}, noop)
	require.ErrorIs(t, err, name.ErrInvalid, "the partition's unit name must fit")
}

// TestFoldPartitions: the worst state, the lowest position, sums of counters and lags, the
// first failing partition's failure.
func TestFoldPartitions(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	pos := func(n int64) eventstore.Position {
		return eventstore.Position{TransactionID: uint64(n), GlobalPosition: n}
	}
	failing := &eventstore.EventRef{StreamID: "order-9"}
	parts := []projection.Status{
		{Name: "o.p0", State: projection.StateRunning, Position: pos(9), EventsProcessed: 5, LagEvents: 1, LagTime: time.Second, Head: pos(12), UpdatedAt: at},
		{Name: "o.p1", State: projection.StateFailing, Position: pos(4), EventsProcessed: 2, LagEvents: 3, LagTime: 3 * time.Second, Head: pos(12),
			LastError: "poison", FailingEvent: failing, Attempts: 2, ParkedStreams: 1, OldestParkedAt: at},
		{Name: "o.p2", State: projection.StateRebuilding, Position: pos(7), EventsProcessed: 1, Head: pos(12), HeldByHorizon: true},
	}
	st := projection.FoldPartitions("o", parts)
	require.Equal(t, "o", st.Name)
	require.Equal(t, projection.StateFailing, st.State)
	require.Equal(t, pos(4), st.Position)
	require.Equal(t, int64(8), st.EventsProcessed)
	require.Equal(t, int64(4), st.LagEvents)
	require.Equal(t, 3*time.Second, st.LagTime)
	require.True(t, st.HeldByHorizon)
	require.Equal(t, "o.p1", st.FailingPartition)
	require.Equal(t, "poison", st.LastError)
	require.Same(t, failing, st.FailingEvent)
	require.Equal(t, 2, st.Attempts)
	require.Equal(t, 1, st.ParkedStreams)
	require.Equal(t, pos(12), st.Head)
	require.Equal(t, at, st.UpdatedAt)
	require.Equal(t, parts, st.Partitions)
	require.Equal(t, projection.ConditionFailing, st.Condition())

	parts[1].State = projection.StatePaused
	require.Equal(t, projection.StatePaused, projection.FoldPartitions("o", parts).State)
	require.Empty(t, projection.FoldPartitions("o", parts).FailingPartition)
}

// TestRunnerPartitionNames: a runner refuses a projection named like another's partition, and
// an unpartitioned projection has one unit, itself.
func TestRunnerPartitionNames(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	backend, err := memory.New(store, memory.Config{})
	require.NoError(t, err)
	noop := projection.OnIdempotent("A", func(context.Context, projection.Event[struct{}]) error { return nil })
	split, err := projection.New("orders", projection.Config{Partitions: 2}, noop)
	require.NoError(t, err)
	clash, err := projection.New("orders.p1", projection.Config{}, noop)
	require.NoError(t, err)
	_, err = projection.NewRunner(backend, projection.RunnerConfig{}, split, clash)
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
	require.ErrorContains(t, err, "partition")

	plain, err := projection.New("plain", projection.Config{}, noop)
	require.NoError(t, err)
	r, err := projection.NewRunner(backend, projection.RunnerConfig{}, split, plain)
	require.NoError(t, err)
	units, err := r.Partitions("plain")
	require.NoError(t, err)
	require.Equal(t, []string{"plain"}, units)
	_, err = r.CatchUpPartition(context.Background(), "plain", 1)
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
	_, err = r.Partitions("nope")
	require.ErrorIs(t, err, projection.ErrUnknownProjection)
}
