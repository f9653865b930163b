package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/projection/projectiontest"
)

// env is a migrated event store and backend on a database of the test's own.
type env struct {
	db      *pgtest.DB
	store   *espg.Store
	backend *postgres.Backend
}

func newEnv(t testing.TB) env {
	t.Helper()
	db := pgtest.New(t)
	store, err := espg.New(db.Pool, espg.Config{})
	require.NoError(t, err)
	b, err := postgres.New(store)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, store.Migrate(ctx))
	require.NoError(t, b.Migrate(ctx))
	return env{db: db, store: store, backend: b}
}

// TestNewTakesTheStore: the backend keeps its tables on the store's database, in the store's
// schema.
func TestNewTakesTheStore(t *testing.T) {
	t.Parallel()
	_, err := postgres.New(nil)
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
	require.ErrorContains(t, err, "needs an event store")

	ctx := context.Background()
	db := pgtest.New(t)
	store, err := espg.New(db.Pool, espg.Config{Schema: "ops"})
	require.NoError(t, err)
	b, err := postgres.New(store)
	require.NoError(t, err)
	require.NoError(t, b.Migrate(ctx))
	rows, err := db.Pool.Query(ctx, `SELECT tablename::text FROM pg_tables WHERE schemaname = 'ops' ORDER BY 1`)
	require.NoError(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"nudge_partition_leases", "nudge_partition_members", "nudge_projection_park_actions", "nudge_projection_parked", "nudge_projection_skips", "nudge_projection_versions", "nudge_projections",
		"nudge_schema_migrations"}, tables)
}

func TestSuite(t *testing.T) {
	t.Parallel()
	projectiontest.Run(t, func(t *testing.T) projectiontest.Env {
		e := newEnv(t)
		return projectiontest.Env{Store: e.store, Backend: e.backend}
	})
}
