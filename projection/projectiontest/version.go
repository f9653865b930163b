package projectiontest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/testlog"
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
}

// sink counts, per version, the events each handled live (a side effect) and as history.
type sink struct {
	mu      sync.Mutex
	live    map[int]map[int]int // version → payload N → times
	history map[int]int         // version → events handled as history
	refuse  map[int]bool        // payload N the handlers of version 2 fail on
}

func newSink() *sink {
	return &sink{live: map[int]map[int]int{1: {}, 2: {}}, history: map[int]int{}, refuse: map[int]bool{}}
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
			s.mu.Lock()
			defer s.mu.Unlock()
			if version == 2 && s.refuse[e.Data.N] {
				return errors.New("version 2 refuses this event")
			}
			if e.Replay != projection.Replaying(ctx) {
				return errors.New("Event.Replay and Replaying disagree")
			}
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

// testVersionCutOver: version 2 registered beside an active version 1 builds as a unit of its
// own from the start, handling history as a replay, then cuts over: the events version 1 had
// not handled are version 2's live ones, and every event has its side effect once. Version 1's
// batches then do nothing.
func testVersionCutOver(t *testing.T, env Env) {
	ctx := context.Background()
	s := newSink()
	v1, v2 := s.projection(t, 1), s.projection(t, 2)
	require.Equal(t, "versioned.v2", v2.Name())
	r, err := projection.NewRunner(env.Backend, projection.RunnerConfig{Logger: testlog.New(t)}, v1)
	require.NoError(t, err)
	require.NoError(t, r.Init(ctx))
	AppendN(t, env.Store, 0, 40)
	_, err = r.CatchUp(ctx, v1.Name())
	require.NoError(t, err)

	both, err := projection.NewRunner(env.Backend, projection.RunnerConfig{Logger: testlog.New(t)}, v1, v2)
	require.NoError(t, err)
	require.NoError(t, both.Init(ctx))
	st, err := both.Status(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, projection.VersionBuilding, st.VersionState)
	require.Equal(t, 1, st.ActiveVersion)
	AppendN(t, env.Store, 40, 9) // not handled by version 1: live in the cut-over
	res, err := both.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.True(t, res.Activated)
	AppendN(t, env.Store, 49, 5)
	res, err = both.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	require.True(t, res.Retired)
	require.Zero(t, res.Events)
	_, err = both.CatchUp(ctx, v2.Name())
	require.NoError(t, err)

	s.mu.Lock()
	defer s.mu.Unlock()
	require.Equal(t, 40, s.history[2], "version 2 replayed what version 1 had handled")
	require.Len(t, s.live[1], 40)
	require.Len(t, s.live[2], 14)
	for n := range 54 {
		require.Equal(t, 1, s.live[1][n]+s.live[2][n], "event %d has its side effect once", n)
	}
	st, err = both.Status(ctx, v1.Name())
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
			r, err := projection.NewRunner(env.Backend, projection.RunnerConfig{Logger: testlog.New(t)}, v1)
			require.NoError(t, err)
			require.NoError(t, r.Init(ctx))
			_, err = r.CatchUp(ctx, v1.Name()) // level with whatever earlier cases appended
			require.NoError(t, err)
			at := AppendN(t, env.Store, 0, 40)
			_, err = r.CatchUp(ctx, v1.Name())
			require.NoError(t, err)
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
