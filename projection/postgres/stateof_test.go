package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/projection"
)

// TestSetStateOfBy: an operator's pause and resume by name (nudge pause, the console) record who
// did it and when in the status row — every partition's — and StatusOf and Statuses show it;
// a pause of a paused projection records nothing, and an unknown name is ErrNotRegistered.
func TestSetStateOfBy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	plain, err := projection.New("plain", projection.Config{}, projection.OnIdempotent("A", ignore))
	require.NoError(t, err)
	parts, err := projection.New("parts", projection.Config{Partitions: 2}, projection.OnIdempotent("A", ignore))
	require.NoError(t, err)
	runner(t, e.backend, plain, parts)

	statuses := func() map[string]projection.Status {
		all, err := e.backend.Statuses(ctx)
		require.NoError(t, err)
		out := map[string]projection.Status{}
		for _, st := range all {
			out[st.Name] = st
		}
		return out
	}
	changed, err := e.backend.SetStateOfBy(ctx, "plain", "ann", projection.StatePaused)
	require.NoError(t, err)
	require.True(t, changed)
	st, err := e.backend.StatusOf(ctx, "plain")
	require.NoError(t, err)
	require.Equal(t, projection.StatePaused, st.State)
	require.Equal(t, "ann", st.StateChangedBy)
	require.WithinDuration(t, time.Now(), st.StateChangedAt, time.Minute)
	require.Equal(t, "ann", statuses()["plain"].StateChangedBy)
	require.True(t, st.StateChangedAt.Equal(statuses()["plain"].StateChangedAt))

	changed, err = e.backend.SetStateOfBy(ctx, "plain", "bob", projection.StatePaused)
	require.NoError(t, err)
	require.False(t, changed, "already paused")
	again, err := e.backend.StatusOf(ctx, "plain")
	require.NoError(t, err)
	require.Equal(t, "ann", again.StateChangedBy)
	require.True(t, st.StateChangedAt.Equal(again.StateChangedAt))

	changed, err = e.backend.SetStateOfBy(ctx, "parts", "carl", projection.StatePaused)
	require.NoError(t, err)
	require.True(t, changed)
	st, err = e.backend.StatusOf(ctx, "parts")
	require.NoError(t, err)
	require.Equal(t, "carl", st.StateChangedBy)
	all := statuses()
	for _, unit := range []string{"parts.p0", "parts.p1"} {
		require.Equal(t, projection.StatePaused, all[unit].State, unit)
		require.Equal(t, "carl", all[unit].StateChangedBy, unit)
	}
	changed, err = e.backend.SetStateOfBy(ctx, "parts", "dora", projection.StateRunning, projection.StatePaused)
	require.NoError(t, err)
	require.True(t, changed)
	require.Equal(t, "dora", statuses()["parts.p1"].StateChangedBy)

	// The columns are the row's own: a plain SQL reader sees them too.
	var by string
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT state_changed_by FROM nudge_projections WHERE name = 'parts.p0'`).Scan(&by))
	require.Equal(t, "dora", by)

	_, err = e.backend.SetStateOfBy(ctx, "missing", "ed", projection.StatePaused)
	require.ErrorIs(t, err, projection.ErrNotRegistered)
}
