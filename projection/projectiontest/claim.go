package projectiontest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
)

// spend waits d, a handler's known cost per event, or until ctx ends.
func spend(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// testVersionPastStoppedActive: version 1's worker (with from partitions; 1: unpartitioned)
// stops while appends go on, more than
// Config.BatchTimeout's worth of version 2's work (a known cost per event), and go on while
// version 2 (with to partitions) builds. Version 2 builds past version 1's frozen position in ordinary batches,
// claiming those events (handled live), and cuts over once the gap left is small, in a short
// transaction: every event is in version 2's read model once and has its side effect once.
// (A cut-over that handled everything appended since version 1 stopped, in one transaction
// bounded by BatchTimeout, timed out on every retry, each with more to do.)
func testVersionPastStoppedActive(t *testing.T, env Env, from, to int) {
	ctx := context.Background()
	s := newSink()
	s.cost = time.Millisecond
	const timeout = 250 * time.Millisecond
	cfg := func(version, partitions int) projection.Config {
		return projection.Config{Version: version, Partitions: partitions, BatchSize: 20, BatchTimeout: timeout, MaxBatchDuration: timeout / 2}
	}
	v1, v2 := s.projectionWith(t, "vstopped", cfg(1, from)), s.projectionWith(t, "vstopped", cfg(2, to))
	const history = 50
	buildBeside(t, env, v1, v2, func() { appendSpread(t, env.Store, 0, history) })
	// Version 1's worker stops here: twice BatchTimeout's worth of version 2's work is appended,
	// and more while version 2 builds (after each of its batches, half a batch).
	backlog := 2 * int(timeout/s.cost)
	AppendN(t, env.Store, history, backlog)
	total, more := history+backlog, 0
	rolledBack := 0 // batches that failed: their handler calls were rolled back
	r, err := projection.NewRunner(env.Backend, projection.RunnerConfig{Logger: testlog.New(t), OnBatch: func(b projection.BatchReport) {
		if b.Err != nil {
			rolledBack++
		}
		if strings.HasPrefix(b.Projection, v2.Name()) && b.Err == nil && more < 300 {
			appendSpread(t, env.Store, total+more, 10)
			more += 10
		}
	}}, v1, v2)
	require.NoError(t, err)
	require.NoError(t, r.Init(ctx))

	var res projection.Result
	var errs []error
	// A handful of catch-ups on a quiet machine; on a busy one batches can pass their
	// BatchTimeout and roll back, and the catch-ups go on until the deadline.
	deadline := time.Now().Add(testwait.For(2 * time.Minute))
	for round := 0; (round < 6 || time.Now().Before(deadline)) && !res.Activated; round++ {
		if res, err = r.CatchUp(ctx, v2.Name()); err != nil {
			errs = append(errs, err)
		}
	}
	require.True(t, res.Activated, "version 2 did not cut over: %v", errors.Join(errs...))
	t.Logf("cut-over past a stopped version 1: %d events appended after it stopped (%d while version 2 built); the catch-up that cut over handled %d events, the cut-over held the locks %s (BatchTimeout %s)",
		backlog+more, more, res.Events, res.CutOverHeld, timeout)
	require.Less(t, res.CutOverHeld, timeout)

	total += more
	// Version 1's worker comes back: it is retired and does nothing.
	res, err = r.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	require.True(t, res.Retired)
	_, err = r.CatchUp(ctx, v2.Name())
	require.NoError(t, err)

	s.mu.Lock()
	defer s.mu.Unlock()
	if rolledBack > 0 || len(errs) > 0 {
		// On a busy machine a batch (or a cut-over) can pass its BatchTimeout and roll back
		// after its handlers ran; its events are handled again by the next. The sink counts
		// calls, not commits, so only at least once can be checked then; the runs without a
		// rollback check exactly once.
		t.Logf("%d batches and %d catch-ups failed (%v): checking that every event was handled, not how often", rolledBack, len(errs), errors.Join(errs...))
		for n := range total {
			require.GreaterOrEqual(t, s.handled[2][n], 1, "event %d is in version 2's read model", n)
			require.GreaterOrEqual(t, s.live[1][n]+s.live[2][n], 1, "event %d has its side effect", n)
		}
		return
	}
	require.Equal(t, history, s.history[2], "version 2 replayed what version 1 had handled")
	for n := range total {
		require.Equal(t, 1, s.handled[2][n], "event %d is in version 2's read model once", n)
		require.Equal(t, 1, s.live[1][n]+s.live[2][n], "event %d has its side effect once", n)
	}
}

// testVersionClaimResume: version 2 (with to partitions; 1: unpartitioned) claims events
// after version 1's position (from partitions) in its batches, and stops before its cut-over
// (its catch-up's guard refuses a batch once it has claimed some). Version 1 resumes: it
// handles the events version 2 claimed as history (Event.Replay, Replaying) — its read model
// stays complete, their side effects are not repeated — and the rest live. Version 2 then
// handles those as history and cuts over: every event has its side effect once and is in each
// version's read model once.
func testVersionClaimResume(t *testing.T, env Env, from, to int) {
	ctx := context.Background()
	s := newSink()
	v1 := s.projectionWith(t, "vclaim", projection.Config{Version: 1, Partitions: from, BatchSize: 7})
	v2 := s.projectionWith(t, "vclaim", projection.Config{Version: 2, Partitions: to, BatchSize: 7})
	both := buildBeside(t, env, v1, v2, func() { appendSpread(t, env.Store, 0, 40) })
	appendSpread(t, env.Store, 40, 48) // version 1 stopped: not handled by it
	for k := range to {
		// Each unit of version 2 builds until a batch of it has claimed events; its guard then
		// stops its catch-up before a cut-over.
		s.mu.Lock()
		before := len(s.live[2])
		s.mu.Unlock()
		guard := func() (func(), bool) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return func() {}, len(s.live[2]) == before
		}
		var res projection.Result
		var err error
		if to > 1 {
			res, err = both.CatchUpPartition(ctx, v2.Name(), k, projection.WithBatchGuard(guard))
		} else {
			res, err = both.CatchUp(ctx, v2.Name(), projection.WithBatchGuard(guard))
		}
		require.NoError(t, err)
		require.False(t, res.Activated)
		require.True(t, res.Stopped, "unit %d: %+v", k, res)
		s.mu.Lock()
		require.Greater(t, len(s.live[2]), before, "unit %d of version 2 claimed events after version 1's position, live", k)
		s.mu.Unlock()
	}
	s.mu.Lock()
	claimed := len(s.live[2])
	s.mu.Unlock()

	// Version 1's worker comes back.
	_, err := both.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	s.mu.Lock()
	require.Equal(t, claimed, s.history[1], "version 1 handled what version 2 claimed as history")
	require.Equal(t, 88-claimed, len(s.live[1]), "version 1 handled the rest live")
	for n := range 88 {
		require.Equal(t, 1, s.handled[1][n], "event %d is in version 1's read model once", n)
	}
	s.mu.Unlock()

	res, err := both.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.True(t, res.Activated)
	afterCutOver(t, both, v1, v2, func() { appendSpread(t, env.Store, 88, 6) })
	s.mu.Lock()
	defer s.mu.Unlock()
	for n := range 94 {
		require.Equal(t, 1, s.live[1][n]+s.live[2][n], "event %d has its side effect once", n)
		require.Equal(t, 1, s.handled[2][n], "event %d is in version 2's read model once", n)
	}
}
