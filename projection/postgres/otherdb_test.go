package postgres_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/pgcluster"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/postgres"
)

// TestConditionOtherDatabase: while a transaction that wrote a table runs in another database
// of the cluster, a projection catches up with events appended meanwhile, and neither its status
// nor the SQL view nudge_projection_conditions calls it held (before, both waited for that
// transaction: held, with a lag of the events appended since it began).
func TestConditionOtherDatabase(t *testing.T) {
	c := pgcluster.ForTest(t)
	ctx := testwait.Context(t, 2*time.Minute)
	pool, err := pgxpool.New(ctx, c.URL("postgres", ""))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, `CREATE DATABASE other`)
	require.NoError(t, err)
	other, err := pgx.Connect(ctx, c.URL("other", ""))
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close(context.Background()) })

	store, err := espg.New(pool, espg.Config{})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	backend, err := postgres.New(store)
	require.NoError(t, err)
	require.NoError(t, backend.Migrate(ctx))
	p, err := projection.New("cond", projection.Config{}, projection.OnIdempotent("A", func(context.Context, projection.Event[json.RawMessage]) error {
		return nil
	}))
	require.NoError(t, err)
	r := runner(t, backend, p)

	report, err := other.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = report.Rollback(ctx) }()
	_, err = report.Exec(ctx, `CREATE TABLE report AS SELECT 1 AS n`)
	require.NoError(t, err)

	for i := range 3 {
		_, err := store.Append(ctx, "s", eventstore.Any, storetest.Event("A", i))
		require.NoError(t, err)
	}
	res, err := r.CatchUp(ctx, "cond")
	require.NoError(t, err)
	require.Equal(t, 3, res.Events, "the events appended while the other database's transaction runs are projected")
	st, err := r.Status(ctx, "cond")
	require.NoError(t, err)
	require.Equal(t, projection.ConditionCaughtUp, st.Condition(), "status: %+v", st)
	require.False(t, st.HeldByHorizon)
	require.Nil(t, st.Holder, "the other database's transaction holds nothing")
	require.Zero(t, st.LagEvents)
	var cond string
	require.NoError(t, pool.QueryRow(ctx, `SELECT condition FROM nudge_projection_conditions WHERE name = 'cond'`).Scan(&cond))
	require.Equal(t, string(projection.ConditionCaughtUp), cond, "the SQL view")
}
