package console_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/postgres"
	pjpg "github.com/nudgeworks/nudge/projection/postgres"
)

// testPool is a pool of four connections on a database of the test's own.
func testPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return pgtest.New(t).NewPool(t, 4)
}

// newBackend migrates nudge's tables on pool and returns an event store and a projection
// backend on them.
func newBackend(ctx context.Context, t *testing.T, pool *pgxpool.Pool) (*espg.Store, *pjpg.Backend) {
	t.Helper()
	require.NoError(t, postgres.Migrate(ctx, pool, ""))
	store, err := espg.New(pool, espg.Config{})
	require.NoError(t, err)
	backend, err := pjpg.New(store)
	require.NoError(t, err)
	return store, backend
}
