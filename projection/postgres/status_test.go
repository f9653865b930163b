package postgres_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/projection"
)

func ignore(context.Context, projection.Event[json.RawMessage]) error { return nil }

// storedTypes reads the event types Register recorded for name.
func (e env) storedTypes(t *testing.T, name string) []string {
	t.Helper()
	var types []string
	require.NoError(t, e.db.Pool.QueryRow(context.Background(), `SELECT event_types FROM nudge_projections WHERE name = $1`, name).Scan(&types))
	return types
}

// TestStatusOfWithoutDefinition: Register records each projection's event types, so StatusOf
// and Statuses compute the same status and lag as Runner.Status from the name alone.
func TestStatusOfWithoutDefinition(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	typed, err := projection.New("typed", projection.Config{}, projection.OnIdempotent("B", ignore), projection.OnIdempotent("A", ignore))
	require.NoError(t, err)
	anyType, err := projection.New("every", projection.Config{}, projection.OnAnyIdempotent(func(context.Context, eventstore.Event) error { return nil }))
	require.NoError(t, err)
	r := runner(t, e.backend, typed, anyType)
	require.Equal(t, []string{"A", "B"}, e.storedTypes(t, "typed"))
	require.Nil(t, e.storedTypes(t, "every"), "NULL: every type")

	res, err := e.store.Append(ctx, "s", eventstore.Any,
		eventstore.EventData{Type: "A", Payload: json.RawMessage(`{}`)},
		eventstore.EventData{Type: "C", Payload: json.RawMessage(`{}`)},
		eventstore.EventData{Type: "B", Payload: json.RawMessage(`{}`)},
		eventstore.EventData{Type: "C", Payload: json.RawMessage(`{}`)},
	)
	require.NoError(t, err)
	storetest.Settle(t, e.store, res.Last())

	for name, lag := range map[string]int64{"typed": 2, "every": 4} {
		want, err := r.Status(ctx, name)
		require.NoError(t, err)
		got, err := e.backend.StatusOf(ctx, name)
		require.NoError(t, err)
		require.Equal(t, lag, got.LagEvents, name)
		require.Equal(t, want.LagEvents, got.LagEvents, name)
		require.Equal(t, want.Head, got.Head, name)
		require.Equal(t, res.Last(), got.Head, name)
		require.Equal(t, want.State, got.State, name)
		require.Positive(t, got.LagTime, name)
	}

	all, err := e.backend.Statuses(ctx)
	require.NoError(t, err)
	require.Len(t, all, 2)
	require.Equal(t, "every", all[0].Name, "sorted by name")
	require.Equal(t, int64(4), all[0].LagEvents)
	require.Equal(t, "typed", all[1].Name)
	require.Equal(t, int64(2), all[1].LagEvents)

	// Caught up: no lag, by name too.
	_, err = r.CatchUp(ctx, "typed")
	require.NoError(t, err)
	st, err := e.backend.StatusOf(ctx, "typed")
	require.NoError(t, err)
	require.Zero(t, st.LagEvents)
	require.Zero(t, st.LagTime)
	require.Equal(t, int64(2), st.EventsProcessed)

	// A row from before the types were recorded counts every type until the next Init.
	_, err = e.db.Pool.Exec(ctx, `UPDATE nudge_projections SET event_types = NULL WHERE name = 'typed'`)
	require.NoError(t, err)
	st, err = e.backend.StatusOf(ctx, "typed")
	require.NoError(t, err)
	require.Equal(t, int64(1), st.LagEvents, "the C after the position counts while the types are unknown")
	require.NoError(t, r.Init(ctx))
	require.Equal(t, []string{"A", "B"}, e.storedTypes(t, "typed"))
	st, err = e.backend.StatusOf(ctx, "typed")
	require.NoError(t, err)
	require.Zero(t, st.LagEvents)

	// A definition that changes its types rewrites them at its next Init.
	narrower, err := projection.New("typed", projection.Config{}, projection.OnIdempotent("C", ignore))
	require.NoError(t, err)
	runner(t, e.backend, narrower)
	require.Equal(t, []string{"C"}, e.storedTypes(t, "typed"))

	_, err = e.backend.StatusOf(ctx, "nosuch")
	require.ErrorIs(t, err, projection.ErrNotRegistered)
}

// TestStatusesEmpty: no status rows is an empty list, not an error.
func TestStatusesEmpty(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	all, err := e.backend.Statuses(context.Background())
	require.NoError(t, err)
	require.Empty(t, all)
}
