package projectiontest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
)

// partitionTests are the suite's tests of partitioned projections (Config.Partitions).
var partitionTests = []struct {
	name string
	run  func(t *testing.T, env Env)
}{
	{"PartitionsCatchUpConcurrently", testPartitionsConcurrent},
	{"PartitionFailsAlone", testPartitionFailsAlone},
	{"PartitionedResetPauseDelete", testPartitionedReset},
	{"PartitionedStatusFolds", testPartitionedStatus},
	{"PartitionCountChangeRefused", testPartitionCount},
	{"PartitionedParkAndRedrive", testPartitionedPark},
	{"PartitionGuardStopsBetweenBatches", testPartitionGuard},
}

// testPartitionGuard: a catch-up with a batch guard asks it before each batch and ends, at the
// last committed position, when it says no (a worker's lease being given back): every batch it
// let run committed whole, none started after the no, and a later catch-up goes on from there.
func testPartitionGuard(t *testing.T, env Env) {
	ctx := context.Background()
	streams := streamNames(40)
	appendRounds(t, env.Store, 3, streams...)
	const count, size = 2, 5
	want := perPartition(streams, 3, count)[1]
	require.Greater(t, want, int64(3*size), "partition 1 needs more than three batches")
	var handled atomic.Int64
	p := mustProjection(t, "guarded", projection.Config{Partitions: count, BatchSize: size},
		projection.OnIdempotent("S", func(context.Context, projection.Event[StreamPayload]) error {
			handled.Add(1)
			return nil
		}))
	r := newRunner(t, env, p)
	var asked, inUse atomic.Int64
	guard := func() (func(), bool) {
		if asked.Add(1) > 3 {
			return nil, false
		}
		require.Zero(t, inUse.Add(1)-1, "one batch at a time")
		return func() { inUse.Add(-1) }, true
	}
	res, err := r.CatchUpPartition(ctx, "guarded", 1, projection.WithBatchGuard(guard))
	require.NoError(t, err)
	require.True(t, res.Stopped, "the guard ended the catch-up")
	require.Equal(t, 3, res.Batches)
	require.Equal(t, int64(3*size), handled.Load(), "three whole batches, nothing after the guard's no")
	require.Zero(t, inUse.Load(), "every batch released its guard")
	st, err := r.Status(ctx, "guarded")
	require.NoError(t, err)
	require.Equal(t, want-int64(3*size), st.Partitions[1].LagEvents, "partition 1 stopped at its third batch's commit")

	res, err = r.CatchUpPartition(ctx, "guarded", 1)
	require.NoError(t, err)
	require.False(t, res.Stopped)
	require.Equal(t, want, handled.Load(), "the next catch-up went on from there, nothing twice")
}

// streamNames returns n stream ids.
func streamNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("order-%d", i)
	}
	return out
}

// perPartition counts the events of streams (each with rounds events) in each of count
// partitions.
func perPartition(streams []string, rounds, count int) []int64 {
	out := make([]int64, count)
	for _, s := range streams {
		out[eventstore.PartitionOf(s, count)] += int64(rounds)
	}
	return out
}

// testPartitionsConcurrent: the four partitions of a projection catch up at once from four
// goroutines (each handler waits until all four partitions are inside a batch, which would
// never happen if they shared a lock); every event is handled once, each stream's versions in
// order, and each partition's position and status are its own.
func testPartitionsConcurrent(t *testing.T, env Env) {
	ctx := testwait.Context(t, 30*time.Second)
	streams := streamNames(24)
	appendRounds(t, env.Store, 5, streams...)
	want := perPartition(streams, 5, 4)
	for k := range want {
		require.Positive(t, want[k], "every partition has streams")
	}
	log := newStreamLog()
	var (
		calls   atomic.Int32
		entered sync.WaitGroup
		inside  [4]sync.Once
		all     = make(chan struct{})
	)
	entered.Add(4)
	go func() { entered.Wait(); close(all) }()
	p := mustProjection(t, "orders", projection.Config{Partitions: 4, BatchSize: 7},
		projection.OnIdempotent("S", func(ctx context.Context, e projection.Event[StreamPayload]) error {
			inside[eventstore.PartitionOf(e.StreamID, 4)].Do(entered.Done)
			select {
			case <-all:
			case <-ctx.Done():
				return ctx.Err()
			}
			calls.Add(1)
			log.add(e)
			return nil
		}))
	r := newRunner(t, env, p)
	units, err := r.Partitions("orders")
	require.NoError(t, err)
	require.Equal(t, []string{"orders.p0", "orders.p1", "orders.p2", "orders.p3"}, units)

	results := make([]projection.Result, 4)
	var wg sync.WaitGroup
	for k := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := r.CatchUpPartition(ctx, "orders", k)
			assert(t, err)
			results[k] = res
		}()
	}
	wg.Wait()
	for k := range 4 {
		require.Equal(t, int(want[k]), results[k].Events, "partition %d handles its streams' events only", k)
	}
	require.Equal(t, int32(120), calls.Load(), "every event once")
	for _, s := range streams {
		require.Equal(t, seq(1, 5), log.of(s), "stream %s in version order", s)
	}
	st, err := r.Status(ctx, "orders")
	require.NoError(t, err)
	require.Len(t, st.Partitions, 4)
	for k, ps := range st.Partitions {
		require.Equal(t, units[k], ps.Name)
		require.Equal(t, want[k], ps.EventsProcessed)
		require.Zero(t, ps.LagEvents)
	}
	require.Equal(t, int64(120), st.EventsProcessed)
	require.Equal(t, projection.ConditionCaughtUp, st.Condition())

	_, err = r.CatchUpPartition(ctx, "orders", 4)
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
	again, err := r.CatchUp(ctx, "orders.p2")
	require.NoError(t, err, "a partition's unit name catches it up")
	require.Zero(t, again.Events)
}

// assert reports err from a goroutine other than the test's.
func assert(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("unexpected error: %v", err)
	}
}

// testPartitionFailsAlone: a poison event stops its partition only, right before it; the other
// partitions handle their events, also those appended after it. The folded status is failing
// and names the partition; a skip of the poison event resumes it.
func testPartitionFailsAlone(t *testing.T, env Env) {
	ctx := context.Background()
	streams := streamNames(16)
	appendRounds(t, env.Store, 3, streams...)
	bad, count := streams[5], 4
	badPart := eventstore.PartitionOf(bad, count)
	log := newStreamLog()
	var broken atomic.Bool
	broken.Store(true)
	p := mustProjection(t, "orders", projection.Config{Partitions: count},
		projection.OnIdempotent("S", func(_ context.Context, e projection.Event[StreamPayload]) error {
			if broken.Load() && e.Data.Stream == bad && e.Data.V == 2 {
				return errors.New("poison")
			}
			log.add(e)
			return nil
		}))
	r := newRunner(t, env, p)
	_, err := r.CatchUp(ctx, "orders")
	var he *projection.HandlerError
	require.ErrorAs(t, err, &he)
	unit := fmt.Sprintf("orders.p%d", badPart)
	require.Equal(t, unit, he.Projection, "the failure names the partition")
	appendRounds(t, env.Store, 1, streams...)
	_, err = r.CatchUp(ctx, "orders")
	require.ErrorAs(t, err, &he)
	for _, s := range streams {
		switch {
		case s == bad:
			require.Equal(t, []int{1}, log.of(s), "the poison's stream stops before it")
		case eventstore.PartitionOf(s, count) == badPart:
			got := log.of(s) // the partition's events after the poison wait
			require.Equal(t, seq(1, len(got)), got, "in order: %s", s)
			require.LessOrEqual(t, len(got), 2, "the failing partition waits: %s", s)
		default:
			require.Equal(t, seq(1, 4), log.of(s), "other partitions go on: %s", s)
		}
	}
	st, err := r.Status(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, projection.StateFailing, st.State)
	require.Equal(t, unit, st.FailingPartition)
	require.NotNil(t, st.FailingEvent)
	require.Equal(t, bad, st.FailingEvent.StreamID)
	for k, ps := range st.Partitions {
		if k == badPart {
			require.Equal(t, projection.StateFailing, ps.State)
			require.Positive(t, ps.LagEvents)
			continue
		}
		require.Equal(t, projection.StateRunning, ps.State)
		require.Zero(t, ps.LagEvents, "partition %d caught up", k)
	}
	require.Equal(t, st.Partitions[badPart].LagEvents, st.LagEvents, "the lag is the failing partition's")

	_, err = r.Skip(ctx, "orders", st.FailingEvent.ID, projection.SkipOptions{By: "ops", Reason: "test"})
	require.NoError(t, err)
	broken.Store(false)
	_, err = r.CatchUp(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, []int{1, 3, 4}, log.of(bad))
	for _, s := range streams {
		if s != bad {
			require.Equal(t, seq(1, 4), log.of(s), "stream %s", s)
		}
	}
	st, err = r.Status(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, projection.ConditionCaughtUp, st.Condition())
	require.Empty(t, st.FailingPartition)
}

// testPartitionedReset: reset, pause, resume and delete act on every partition at once, and
// the reset and delete hooks run once.
func testPartitionedReset(t *testing.T, env Env) {
	ctx := context.Background()
	streams := streamNames(12)
	appendRounds(t, env.Store, 2, streams...)
	var inits, resets, deletes, calls atomic.Int32
	p := mustProjection(t, "orders", projection.Config{
		Partitions: 3,
		InitFunc:   func(context.Context, projection.HookParams) error { inits.Add(1); return nil },
		ResetFunc:  func(context.Context, projection.HookParams) error { resets.Add(1); return nil },
		DeleteFunc: func(context.Context, projection.HookParams) error { deletes.Add(1); return nil },
	}, projection.OnIdempotent("S", func(context.Context, projection.Event[StreamPayload]) error { calls.Add(1); return nil }))
	r := newRunner(t, env, p)
	require.Equal(t, int32(1), inits.Load(), "init runs once for all partitions")
	res, err := r.CatchUp(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, 24, res.Events)

	require.NoError(t, r.Reset(ctx, "orders"))
	require.Equal(t, int32(1), resets.Load())
	st, err := r.Status(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, projection.StateRebuilding, st.State)
	for _, ps := range st.Partitions {
		require.Equal(t, projection.StateRebuilding, ps.State)
		require.True(t, ps.Position.IsZero())
	}
	require.Equal(t, int64(24), st.LagEvents)
	res, err = r.CatchUp(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, 24, res.Events)
	require.Equal(t, int32(48), calls.Load())
	st, err = r.Status(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, projection.StateRunning, st.State)

	require.NoError(t, r.Pause(ctx, "orders"))
	appendRounds(t, env.Store, 1, streams...)
	res, err = r.CatchUpPartition(ctx, "orders", 1)
	require.NoError(t, err)
	require.True(t, res.Paused, "every partition is paused")
	require.NoError(t, r.Resume(ctx, "orders"))
	res, err = r.CatchUp(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, 12, res.Events)

	require.NoError(t, r.Delete(ctx, "orders"))
	require.Equal(t, int32(1), deletes.Load())
	for k := range 3 {
		_, err := r.CatchUpPartition(ctx, "orders", k)
		require.ErrorIs(t, err, projection.ErrNotRegistered, "partition %d is gone", k)
	}
}

// testPartitionedStatus: each partition's lag counts its own streams' events; the projection's
// status sums them, takes the lowest position and the worst state.
func testPartitionedStatus(t *testing.T, env Env) {
	ctx := context.Background()
	streams := streamNames(20)
	appendRounds(t, env.Store, 3, streams...)
	p := mustProjection(t, "orders", projection.Config{Partitions: 4},
		projection.OnIdempotent("S", func(context.Context, projection.Event[StreamPayload]) error { return nil }))
	r := newRunner(t, env, p)
	want := perPartition(streams, 3, 4)
	// On PostgreSQL another test's transaction anywhere in the cluster may hold the horizon a
	// moment, and a held status counts fewer events: compare one nothing held.
	var st projection.Status
	require.Eventually(t, func() bool {
		var err error
		st, err = r.Status(ctx, "orders")
		require.NoError(t, err)
		return !st.HeldByHorizon
	}, testwait.For(time.Minute), 10*time.Millisecond, "a status no transaction held")
	require.Equal(t, int64(60), st.LagEvents)
	for k, ps := range st.Partitions {
		require.Equal(t, want[k], ps.LagEvents, "partition %d's lag counts its streams only", k)
		require.Equal(t, "orders", ps.PartitionOf)
		require.Equal(t, eventstore.Partition{Index: k, Count: 4}, ps.Partition)
	}
	res, err := r.CatchUpPartition(ctx, "orders", 2)
	require.NoError(t, err)
	st, err = r.Status(ctx, "orders")
	require.NoError(t, err)
	require.Zero(t, st.Partitions[2].LagEvents)
	require.Equal(t, res.Position, st.Partitions[2].Position)
	require.Equal(t, 60-want[2], st.LagEvents)
	require.True(t, st.Position.IsZero(), "the lowest partition's position")
	require.Equal(t, projection.ConditionWorking, st.Condition())

	all, err := r.Statuses(ctx)
	require.NoError(t, err)
	require.Len(t, all, 1)
	require.Equal(t, "orders", all[0].Name)
	require.Len(t, all[0].Partitions, 4)
	_, err = r.CatchUp(ctx, "orders")
	require.NoError(t, err)
	require.NoError(t, r.WaitCaughtUp(testwait.Context(t, 10*time.Second), "orders"))
}

// testPartitionCount: a projection registered with one partition count is refused with
// another (or unpartitioned) until it is deleted and rebuilt.
func testPartitionCount(t *testing.T, env Env) {
	ctx := context.Background()
	appendRounds(t, env.Store, 2, streamNames(8)...)
	handler := projection.OnIdempotent("S", func(context.Context, projection.Event[StreamPayload]) error { return nil })
	four := mustProjection(t, "orders", projection.Config{Partitions: 4}, handler)
	r4 := newRunner(t, env, four)
	_, err := r4.CatchUp(ctx, "orders")
	require.NoError(t, err)

	for _, count := range []int{2, 1} {
		other := mustProjection(t, "orders", projection.Config{Partitions: count}, handler)
		r, err := projection.NewRunner(env.Backend, projection.RunnerConfig{Logger: testlog.New(t)}, other)
		require.NoError(t, err)
		err = r.Init(ctx)
		require.ErrorIs(t, err, projection.ErrPartitionCount)
		var pce *projection.PartitionCountError
		require.ErrorAs(t, err, &pce)
		require.Equal(t, projection.PartitionCountError{Projection: "orders", Registered: 4, Configured: count}, *pce)
		require.ErrorContains(t, err, "rebuild")
	}
	st, err := r4.Status(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, int64(16), st.EventsProcessed, "a refused registration changes nothing")

	require.NoError(t, r4.Delete(ctx, "orders"))
	two := mustProjection(t, "orders", projection.Config{Partitions: 2}, handler)
	r2 := newRunner(t, env, two)
	res, err := r2.CatchUp(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, 16, res.Events, "the new count rebuilds from the start")

	plain := mustProjection(t, "plain", projection.Config{}, handler)
	newRunner(t, env, plain)
	split := mustProjection(t, "plain", projection.Config{Partitions: 2}, handler)
	rs, err := projection.NewRunner(env.Backend, projection.RunnerConfig{Logger: testlog.New(t)}, split)
	require.NoError(t, err)
	var pce *projection.PartitionCountError
	require.ErrorAs(t, rs.Init(ctx), &pce)
	require.Equal(t, 1, pce.Registered)
}

// testPartitionedPark: with OnFailurePark, a stream parks in its partition (the partition goes
// on past it); Parked lists it by the projection's name, and Redrive and PurgeParked reach it
// there.
func testPartitionedPark(t *testing.T, env Env) {
	ctx := context.Background()
	streams := streamNames(8)
	appendRounds(t, env.Store, 4, streams...)
	bad := streams[3]
	log := newStreamLog()
	var broken atomic.Bool
	broken.Store(true)
	p := parkable(t, "orders", projection.Config{Partitions: 2, ParkAfterAttempts: 1}, log, &broken, bad, 2, errors.New("bug"))
	r := newRunner(t, env, p)
	_, err := r.CatchUp(ctx, "orders")
	require.NoError(t, err, "the stream parks at the first failure; its partition goes on")
	parked, err := r.Parked(ctx, "orders")
	require.NoError(t, err)
	require.Len(t, parked, 1)
	unit, err := projection.PartitionUnitName("orders", eventstore.PartitionOf(bad, 2), 2)
	require.NoError(t, err)
	require.Equal(t, unit, parked[0].Projection)
	require.Equal(t, bad, parked[0].StreamID)
	require.Equal(t, int64(2), parked[0].Held)
	for _, s := range streams {
		if s != bad {
			require.Equal(t, seq(1, 4), log.of(s))
		}
	}
	st, err := r.Status(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, 1, st.ParkedStreams)
	require.Equal(t, projection.StateRunning, st.State)

	_, err = r.Redrive(ctx, "orders", "order-0", "test")
	require.ErrorIs(t, err, projection.ErrNotParked)
	broken.Store(false)
	n, err := r.Redrive(ctx, "orders", bad, "test")
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, seq(1, 4), log.of(bad))
	require.NoError(t, r.PurgeParked(ctx, "orders", projection.ParkOptions{By: "test", Reason: "nothing left"}))
	parked, err = r.Parked(ctx, "orders")
	require.NoError(t, err)
	require.Empty(t, parked)
}
