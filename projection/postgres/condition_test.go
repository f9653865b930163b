package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/pgcluster"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/projection/projectiontest"
)

// TestOneCondition: on a private cluster (no other transaction there to hold the horizon),
// a projection goes through working, caught up, held, failing, paused, rebuilding and retired, and at
// each step Status.Condition and the SQL view nudge_projection_conditions say the same word;
// WaitCaughtUp returns only once the condition is caught up.
func TestOneCondition(t *testing.T) {
	c := pgcluster.ForTest(t)
	ctx := testwait.Context(t, 2*time.Minute)
	pool, err := pgxpool.New(ctx, c.URL("postgres", ""))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := espg.New(pool, espg.Config{})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	backend, err := postgres.New(store)
	require.NoError(t, err)
	require.NoError(t, backend.Migrate(ctx))

	poison := errors.New("poison")
	bad := false
	p, err := projection.New("cond", projection.Config{}, projection.OnIdempotent("A", func(context.Context, projection.Event[json.RawMessage]) error {
		if bad {
			return poison
		}
		return nil
	}))
	require.NoError(t, err)
	r := runner(t, backend, p)
	check := func(want projection.Condition) {
		t.Helper()
		st, err := r.Status(ctx, "cond")
		require.NoError(t, err)
		require.Equal(t, want, st.Condition(), "status: %+v", st)
		var sql string
		require.NoError(t, pool.QueryRow(ctx, `SELECT condition FROM nudge_projection_conditions WHERE name = 'cond'`).Scan(&sql))
		require.Equal(t, string(want), sql, "the SQL view")
	}

	projectiontest.AppendN(t, store, 0, 3, "A")
	check(projection.ConditionWorking)
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	require.ErrorIs(t, r.WaitCaughtUp(short, "cond"), context.DeadlineExceeded, "nothing catches it up")
	cancelShort()
	_, err = r.CatchUp(ctx, "cond")
	require.NoError(t, err)
	check(projection.ConditionCaughtUp)
	require.NoError(t, r.WaitCaughtUp(ctx))

	open, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = open.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)
	late, err := store.Append(ctx, "late", eventstore.Any, storetest.Event("A", 9))
	require.NoError(t, err)
	check(projection.ConditionHeld)
	st, err := r.Status(ctx, "cond")
	require.NoError(t, err)
	require.NotNil(t, st.Holder)
	require.Positive(t, st.Holder.PID)
	short, cancelShort = context.WithTimeout(ctx, 50*time.Millisecond)
	require.ErrorIs(t, r.WaitCaughtUp(short, "cond"), context.DeadlineExceeded, "held is not caught up")
	cancelShort()
	require.NoError(t, open.Rollback(ctx))
	storetest.Settle(t, store, late.Last())
	check(projection.ConditionWorking)

	bad = true
	_, err = r.CatchUp(ctx, "cond")
	require.ErrorIs(t, err, poison)
	check(projection.ConditionFailing)
	bad = false
	_, err = r.CatchUp(ctx, "cond")
	require.NoError(t, err)
	check(projection.ConditionCaughtUp)

	require.NoError(t, r.Pause(ctx, "cond"))
	check(projection.ConditionPaused)
	require.NoError(t, r.Resume(ctx, "cond"))
	require.NoError(t, r.Reset(ctx, "cond"))
	check(projection.ConditionRebuilding)

	// Version 2 builds beside it and cuts over: version 1 is retired, however far behind.
	v2, err := projection.New("cond", projection.Config{Version: 2}, projection.OnIdempotent("A",
		func(context.Context, projection.Event[json.RawMessage]) error { return nil }))
	require.NoError(t, err)
	r2 := runner(t, backend, v2)
	res, err := r2.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	require.True(t, res.Activated)
	projectiontest.AppendN(t, store, 20, 2, "A")
	check(projection.ConditionRetired)
	require.NoError(t, r.WaitCaughtUp(ctx, "cond"), "a retired version has nothing left to wait for")
}

// TestLagEstimatedPastTheWindow: the status counts at most 1,000 events after the position and
// estimates the rest from global positions, so its cost does not grow with the backlog; the
// estimate keeps the share of the projection's types, and the count is exact again below
// 1,000.
func TestLagEstimatedPastTheWindow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	events := make([]eventstore.EventData, 0, 3000)
	for i := range 3000 {
		typ := "A"
		if i%2 == 1 {
			typ = "B"
		}
		events = append(events, storetest.Event(typ, i))
	}
	res, err := e.store.Append(ctx, "many", eventstore.NoStream, events...)
	require.NoError(t, err)
	storetest.Settle(t, e.store, res.Last())
	r := runner(t, e.backend,
		mustNew(t, "typed", projection.OnIdempotent("A", func(context.Context, projection.Event[json.RawMessage]) error { return nil })),
		mustNew(t, "every", projection.OnIdempotent("A", func(context.Context, projection.Event[json.RawMessage]) error { return nil }),
			projection.OnIdempotent("B", func(context.Context, projection.Event[json.RawMessage]) error { return nil })))

	for name, exact := range map[string]int64{"typed": 1500, "every": 3000} {
		st, err := r.Status(ctx, name)
		require.NoError(t, err)
		require.True(t, st.LagEstimated, name)
		require.InDelta(t, exact, st.LagEvents, float64(exact)/10, name)
		require.Positive(t, st.LagTime, name)
	}
	// Catch "every" up to 600 events before the end: exact again.
	_, err = e.db.Pool.Exec(ctx, `UPDATE nudge_projections SET transaction_id = $1, global_position = $2 WHERE name = 'every'`,
		res.Events[2399].Position.TransactionID, res.Events[2399].Position.GlobalPosition)
	require.NoError(t, err)
	st, err := r.Status(ctx, "every")
	require.NoError(t, err)
	require.False(t, st.LagEstimated)
	require.Equal(t, int64(600), st.LagEvents)
}
