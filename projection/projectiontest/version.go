package projectiontest

import (
	"context"
	"errors"
	"sync"
	"testing"

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
	p, err := projection.New("versioned", projection.Config{Version: version, BatchSize: 7},
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
