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
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
)

// versionTests are the suite's tests of versioned projections.
var versionTests = []struct {
	name string
	run  func(t *testing.T, env Env)
}{
	{"VersionBuildsBesideAndCutsOver", testVersionCutOver},
	{"VersionCutOverWaitsForAFix", testVersionCutOverFailing},
	{"VersionBuildPacedByTheActiveLag", testVersionBuildPaced},
	{"VersionBuildBatchesSizedWhilePaced", testVersionBuildBatchesSized},
	{"VersionHistoryIsAReplayForEveryHandlerKind", testVersionReplayFlags},
	{"VersionPartitioned1To4", func(t *testing.T, env Env) { testVersionPartitioned(t, env, 1, 4) }},
	{"VersionPartitioned4To8", func(t *testing.T, env Env) { testVersionPartitioned(t, env, 4, 8) }},
	{"VersionPartitioned4To1", func(t *testing.T, env Env) { testVersionPartitioned(t, env, 4, 1) }},
	{"VersionPartitioned3To4", func(t *testing.T, env Env) { testVersionPartitioned(t, env, 3, 4) }},
	{"VersionCutsOverPastAStoppedActive", func(t *testing.T, env Env) { testVersionPastStoppedActive(t, env, 1, 1) }},
	{"VersionCutsOverPastAStoppedActivePartitioned3To4", func(t *testing.T, env Env) { testVersionPastStoppedActive(t, env, 3, 4) }},
	{"VersionClaimedEventsAreHistoryForTheActive", func(t *testing.T, env Env) { testVersionClaimResume(t, env, 1, 1) }},
	{"VersionClaimedEventsAreHistoryForTheActivePartitioned3To4", func(t *testing.T, env Env) { testVersionClaimResume(t, env, 3, 4) }},
	{"VersionClaimedEventsAreHistoryForTheActivePartitioned1To4", func(t *testing.T, env Env) { testVersionClaimResume(t, env, 1, 4) }},
}

// sink counts, per version, the events each handled live (a side effect) and as history.
type sink struct {
	mu      sync.Mutex
	live    map[int]map[int]int // version → payload N → times
	history map[int]int         // version → events handled as history
	refuse  map[int]bool        // payload N the handlers of version 2 fail on
	handled map[int]map[int]int // version → payload N → times handled, live or as history
	// cost is what each event costs version 2's handler (waited out, or until the context
	// ends): a known per-event cost against Config.BatchTimeout.
	cost time.Duration
}

func newSink() *sink {
	return &sink{live: map[int]map[int]int{1: {}, 2: {}}, history: map[int]int{}, refuse: map[int]bool{},
		handled: map[int]map[int]int{1: {}, 2: {}}}
}

func (s *sink) projection(t *testing.T, version int) *projection.Projection {
	t.Helper()
	return s.projectionWith(t, "versioned", projection.Config{Version: version, BatchSize: 7})
}

// projectionWith is projection with the name and configuration given.
func (s *sink) projectionWith(t *testing.T, name string, cfg projection.Config) *projection.Projection {
	t.Helper()
	version := cfg.Version
	p, err := projection.New(name, cfg,
		projection.OnIdempotent("A", func(ctx context.Context, e projection.Event[Payload]) error {
			if version == 2 && s.cost > 0 {
				if err := spend(ctx, s.cost); err != nil {
					return err
				}
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if version == 2 && s.refuse[e.Data.N] {
				return errors.New("version 2 refuses this event")
			}
			if e.Replay != projection.Replaying(ctx) {
				return errors.New("Event.Replay and Replaying disagree")
			}
			s.handled[version][e.Data.N]++
			if e.Replay {
				s.history[version]++
			} else {
				s.live[version][e.Data.N]++
			}
			return nil
		}))
	require.NoError(t, err)
	return p
}

// buildBeside makes v1 active, appends (appendHistory) and catches v1 up, then registers v2
// beside it (checked building) and returns a runner of both.
func buildBeside(t *testing.T, env Env, v1, v2 *projection.Projection, appendHistory func()) *projection.Runner {
	t.Helper()
	ctx := context.Background()
	r, err := projection.NewRunner(env.Backend, projection.RunnerConfig{Logger: testlog.New(t)}, v1)
	require.NoError(t, err)
	require.NoError(t, r.Init(ctx))
	appendHistory()
	// Version 1 handles all of it, even while a transaction elsewhere holds the horizon back
	// for a moment (the tests count on it having handled every event of the history live).
	var lastErr error
	require.Eventually(t, func() bool {
		if _, lastErr = r.CatchUp(ctx, v1.Name()); lastErr != nil {
			return false
		}
		st, err := r.Status(ctx, v1.Name())
		lastErr = err
		return err == nil && st.Condition() == projection.ConditionCaughtUp
	}, testwait.For(time.Minute), 5*time.Millisecond, "version 1 catches up with the history")
	require.NoError(t, lastErr)
	both, err := projection.NewRunner(env.Backend, projection.RunnerConfig{Logger: testlog.New(t)}, v1, v2)
	require.NoError(t, err)
	require.NoError(t, both.Init(ctx))
	st, err := both.Status(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, projection.VersionBuilding, st.VersionState)
	require.Equal(t, 1, st.ActiveVersion)
	return both
}

// afterCutOver appends (appendLive) after version 2's cut-over: version 1's catch-up finds
// itself retired and does nothing, version 2's handles them.
func afterCutOver(t *testing.T, both *projection.Runner, v1, v2 *projection.Projection, appendLive func()) {
	t.Helper()
	ctx := context.Background()
	appendLive()
	res, err := both.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	require.True(t, res.Retired)
	require.Zero(t, res.Events)
	_, err = both.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
}

// testVersionCutOver: version 2 registered beside an active version 1 builds as a unit of its
// own from the start, handling history as a replay, then cuts over: the events version 1 had
// not handled are version 2's live ones, and every event has its side effect once. Version 1's
// batches then do nothing.
func testVersionCutOver(t *testing.T, env Env) {
	ctx := context.Background()
	s := newSink()
	v1, v2 := s.projection(t, 1), s.projection(t, 2)
	require.Equal(t, "versioned.v2", v2.Name())
	both := buildBeside(t, env, v1, v2, func() { AppendN(t, env.Store, 0, 40) })
	AppendN(t, env.Store, 40, 9) // not handled by version 1: live in the cut-over
	res, err := both.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.True(t, res.Activated)
	afterCutOver(t, both, v1, v2, func() { AppendN(t, env.Store, 49, 5) })

	s.mu.Lock()
	defer s.mu.Unlock()
	require.Equal(t, 40, s.history[2], "version 2 replayed what version 1 had handled")
	require.Len(t, s.live[1], 40)
	require.Len(t, s.live[2], 14)
	for n := range 54 {
		require.Equal(t, 1, s.live[1][n]+s.live[2][n], "event %d has its side effect once", n)
	}
	st, err := both.Status(ctx, v1.Name())
	require.NoError(t, err)
	require.Equal(t, projection.VersionRetired, st.VersionState)
	require.Equal(t, 2, st.ActiveVersion)
}

// testVersionCutOverFailing: an event version 2 fails on (one version 1 has not handled, so it
// is met in the cut-over) fails version 2 only, and no cut-over happens until it is fixed.
func testVersionCutOverFailing(t *testing.T, env Env) {
	ctx := context.Background()
	s := newSink()
	v1, v2 := s.projection(t, 1), s.projection(t, 2)
	r, err := projection.NewRunner(env.Backend, projection.RunnerConfig{Logger: testlog.New(t)}, v1, v2)
	require.NoError(t, err)
	require.NoError(t, r.Init(ctx))
	AppendN(t, env.Store, 0, 20)
	_, err = r.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	s.mu.Lock()
	s.refuse[25] = true
	s.mu.Unlock()
	AppendN(t, env.Store, 20, 10)
	res, err := r.CatchUp(ctx, v2.Name())
	require.ErrorIs(t, err, projection.ErrHandler)
	require.False(t, res.Activated)
	st, err := r.Status(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, projection.StateFailing, st.State)
	require.Equal(t, projection.VersionBuilding, st.VersionState)
	st, err = r.Status(ctx, v1.Name())
	require.NoError(t, err)
	require.Equal(t, projection.StateRunning, st.State)
	require.Equal(t, projection.VersionActive, st.VersionState)

	s.mu.Lock()
	s.refuse[25] = false
	s.mu.Unlock()
	res, err = r.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.True(t, res.Activated)
	st, err = r.Status(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, projection.StateRunning, st.State)
	require.Equal(t, projection.VersionActive, st.VersionState)
}

// testVersionBuildPaced: a building version waits between its batches of history while the
// active version runs behind by more than Config.BuildLagTarget, and not when the active
// version is level, paused, or when pacing is off.
func testVersionBuildPaced(t *testing.T, env Env) {
	ctx := context.Background()
	cases := []struct {
		name   string
		target time.Duration
		lag    bool // the active version has events it has not handled
		pause  bool // the active version is paused
		paced  bool
	}{
		{"behind", time.Millisecond, true, false, true},
		{"level", time.Millisecond, false, false, false},
		{"paused", time.Millisecond, true, true, false},
		{"off", -1, true, false, false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newSink()
			name := fmt.Sprintf("paced_%d", i)
			v1 := s.projectionWith(t, name, projection.Config{Version: 1, BatchSize: 7})
			v2 := s.projectionWith(t, name, projection.Config{Version: 2, BatchSize: 7, BuildLagTarget: c.target})
			r, at := activeWithHistory(t, env, v1, 40)
			if c.lag {
				AppendN(t, env.Store, 40, 1)
				require.Eventually(t, func() bool {
					st, err := r.Status(ctx, v1.Name())
					return err == nil && st.LagTime > c.target
				}, 10*time.Second, time.Millisecond, "the active version lags by more than the target")
			}
			if c.pause {
				require.NoError(t, r.Pause(ctx, v1.Name()))
			}
			both, err := projection.NewRunner(env.Backend, projection.RunnerConfig{Logger: testlog.New(t)}, v1, v2)
			require.NoError(t, err)
			require.NoError(t, both.Init(ctx))
			res, err := both.CatchUp(ctx, v2.Name())
			require.NoError(t, err)
			require.True(t, res.Activated)
			require.GreaterOrEqual(t, res.Events, len(at))
			if c.paced {
				require.Positive(t, res.Paced, "the build waited for the active version")
			} else {
				require.Zero(t, res.Paced, "the build ran at full speed")
			}
		})
	}
}

// activeWithHistory runs the active version v1 in a runner of its own, level with whatever
// earlier tests appended, then appends n events (numbered from 0) and catches v1 up to them;
// it returns the runner and the events' positions.
func activeWithHistory(t *testing.T, env Env, v1 *projection.Projection, n int) (*projection.Runner, []eventstore.Position) {
	t.Helper()
	ctx := context.Background()
	r, err := projection.NewRunner(env.Backend, projection.RunnerConfig{Logger: testlog.New(t)}, v1)
	require.NoError(t, err)
	require.NoError(t, r.Init(ctx))
	_, err = r.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	at := AppendN(t, env.Store, 0, n)
	_, err = r.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	return r, at
}

// testVersionBuildBatchesSized: while the active version takes live events, a paced build's
// batches after the first are sized to take a share of the lag target (down to the pacer's
// smallest, 10 events, with a target of a few nanoseconds); an unpaced build reads whole
// batches.
func testVersionBuildBatchesSized(t *testing.T, env Env) {
	ctx := context.Background()
	for i, c := range []struct {
		name   string
		target time.Duration
		want   []int // the events of the build's batches of history
	}{
		{"paced", 2 * time.Nanosecond, []int{20, 10, 10, 10, 10}},
		{"off", -1, []int{20, 20, 20}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSink()
			name := fmt.Sprintf("sized_%d", i)
			v1 := s.projectionWith(t, name, projection.Config{Version: 1, BatchSize: 20})
			v2 := s.projectionWith(t, name, projection.Config{Version: 2, BatchSize: 20, BuildLagTarget: c.target})
			r, _ := activeWithHistory(t, env, v1, 60)
			last := AppendN(t, env.Store, 60, 1) // the active version's lag: an event it has not handled
			require.Eventually(t, func() bool {
				st, err := r.Status(ctx, v1.Name())
				return err == nil && st.LagTime > 0
			}, 10*time.Second, time.Millisecond, "the active version lags")
			var (
				mu      sync.Mutex
				batches []int
				ticks   atomic.Int64
			)
			// The runner's clock moves 100 µs a reading, not with the wall: version 1's
			// position stands still (no worker runs it), and on a busy machine the build's
			// waits could pass the pacer's idle second, which grows the batches back.
			epoch := time.Now()
			tick := func() time.Time { return epoch.Add(time.Duration(ticks.Add(1)) * 100 * time.Microsecond) }
			both, err := projection.NewRunner(env.Backend, projection.RunnerConfig{Logger: testlog.New(t), NowFunc: tick, OnBatch: func(b projection.BatchReport) {
				mu.Lock()
				defer mu.Unlock()
				if b.Projection == v2.Name() {
					batches = append(batches, b.Events)
				}
			}}, v1, v2)
			require.NoError(t, err)
			require.NoError(t, both.Init(ctx))
			res, err := both.CatchUp(ctx, v2.Name())
			require.NoError(t, err)
			require.True(t, res.Activated)
			require.Equal(t, last[0], res.Position, "cut over at the head")
			mu.Lock()
			defer mu.Unlock()
			require.GreaterOrEqual(t, len(batches), len(c.want))
			require.Equal(t, c.want, batches[:len(c.want)], "the build's batches of the 60 events version 1 handled")
		})
	}
}

// appendSpread appends the events numbered from..from+n-1 ("A", Payload N), one per append,
// event i to stream order-<i mod 24>, and waits until all are readable.
func appendSpread(t *testing.T, s eventstore.Store, from, n int) {
	t.Helper()
	var last eventstore.Position
	for i := from; i < from+n; i++ {
		data, err := eventstore.NewEventData("A", Payload{N: i})
		require.NoError(t, err)
		res, err := s.Append(context.Background(), fmt.Sprintf("order-%d", i%24), eventstore.Any, data)
		require.NoError(t, err)
		last = res.Last()
	}
	storetest.Settle(t, s, last)
}

// testVersionPartitioned: version 2 of a projection, with to partitions, is built beside
// version 1 with from (1: unpartitioned), and cuts over. Its partitions build apart, each up to
// what the active version's partitions holding its streams have handled; a cut-over tried
// while a partition is behind waits; the cut-over brings every partition to the head, telling
// history (events some active partition handled after the building partitions were level)
// from live events per event: every event has its side effect once. Version 1's partitions
// then do nothing, and its retired read model is dropped as a whole.
func testVersionPartitioned(t *testing.T, env Env, from, to int) {
	ctx := context.Background()
	s := newSink()
	v1 := s.projectionWith(t, "vparts", projection.Config{Version: 1, Partitions: from, BatchSize: 7})
	v2 := s.projectionWith(t, "vparts", projection.Config{Version: 2, Partitions: to, BatchSize: 7})
	both := buildBeside(t, env, v1, v2, func() { appendSpread(t, env.Store, 0, 96) })
	for k := range to - 1 {
		// Level with version 1, but the last partition has all its history (more than a batch) to go.
		res, err := both.CatchUpPartition(ctx, v2.Name(), k)
		require.NoError(t, err)
		require.False(t, res.Activated, "partition %d cut over while the last one was behind", k)
	}
	appendSpread(t, env.Store, 96, 24) // not handled by version 1 yet
	var err error
	if from > 1 {
		_, err = both.CatchUpPartition(ctx, v1.Name(), 0) // one active partition moves on: some of those are history now
	} else {
		_, err = both.CatchUp(ctx, v1.Name())
	}
	require.NoError(t, err)
	res, err := both.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.True(t, res.Activated)

	s.mu.Lock()
	handledBy1 := len(s.live[1])
	require.Equal(t, handledBy1, s.history[2], "version 2 replayed exactly what version 1 had handled")
	require.Greater(t, handledBy1, 96, "version 1 handled some events after version 2's partitions were level")
	if from > 1 {
		require.Less(t, handledBy1, 120, "version 1 left some events to the cut-over")
	}
	s.mu.Unlock()

	afterCutOver(t, both, v1, v2, func() { appendSpread(t, env.Store, 120, 10) })
	s.mu.Lock()
	for n := range 130 {
		require.Equal(t, 1, s.live[1][n]+s.live[2][n], "event %d has its side effect once", n)
	}
	s.mu.Unlock()

	st, err := both.Status(ctx, v1.Name())
	require.NoError(t, err)
	require.Equal(t, projection.VersionRetired, st.VersionState)
	require.Equal(t, 2, st.ActiveVersion)
	st, err = both.Status(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, projection.VersionActive, st.VersionState)
	require.Zero(t, st.LagEvents)
	require.NoError(t, both.DropRetired(ctx, v1.Name()), "a retired partitioned version is dropped as a whole")
	require.NoError(t, both.DropRetired(ctx, v1.Name()), "and once")
}
