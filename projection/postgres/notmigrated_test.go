package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/projection/projectiontest"
)

// unmigrated returns a store and a backend on a database of the test's own where neither
// Migrate has run.
func unmigrated(t *testing.T) (*pgtest.DB, *espg.Store, *postgres.Backend) {
	t.Helper()
	db := pgtest.New(t)
	store, err := espg.New(db.Pool, espg.Config{})
	require.NoError(t, err)
	b, err := postgres.New(store)
	require.NoError(t, err)
	return db, store, b
}

func anyProjection(t *testing.T, name string) *projection.Projection {
	t.Helper()
	p, err := projection.New(name, projection.Config{},
		projection.OnAnyIdempotent(func(context.Context, eventstore.Event) error { return nil }))
	require.NoError(t, err)
	return p
}

// TestInitNotMigrated: Runner.Init on a database without the store's or the backend's tables
// fails at once with the sentinel of what is missing, which says to migrate.
func TestInitNotMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("nothing", func(t *testing.T) {
		t.Parallel()
		_, _, b := unmigrated(t)
		r, err := projection.NewRunner(b, projection.RunnerConfig{}, anyProjection(t, "p"))
		require.NoError(t, err)
		err = r.Init(ctx)
		require.ErrorIs(t, err, eventstore.ErrNotMigrated)
		require.ErrorContains(t, err, "`nudge migrate`")
	})

	t.Run("store only", func(t *testing.T) {
		t.Parallel()
		_, store, b := unmigrated(t)
		require.NoError(t, store.Migrate(ctx))
		r, err := projection.NewRunner(b, projection.RunnerConfig{}, anyProjection(t, "p"))
		require.NoError(t, err)
		err = r.Init(ctx)
		require.ErrorIs(t, err, projection.ErrNotMigrated)
		require.ErrorContains(t, err, "run Migrate on the backend (projection/postgres Backend.Migrate) or `nudge migrate` first")

		_, err = r.CatchUp(ctx, "p")
		require.ErrorIs(t, err, projection.ErrNotMigrated)
		_, err = r.Status(ctx, "p")
		require.ErrorIs(t, err, projection.ErrNotMigrated)
		_, err = b.StatusOf(ctx, "p")
		require.ErrorIs(t, err, projection.ErrNotMigrated)
		_, err = b.Statuses(ctx)
		require.ErrorIs(t, err, projection.ErrNotMigrated)
	})

	t.Run("backend only", func(t *testing.T) {
		t.Parallel()
		_, _, b := unmigrated(t)
		require.NoError(t, b.Migrate(ctx))
		r, err := projection.NewRunner(b, projection.RunnerConfig{}, anyProjection(t, "p"))
		require.NoError(t, err)
		require.ErrorIs(t, r.Init(ctx), eventstore.ErrNotMigrated)
	})
}

// TestUsersMissingTableIsNotNotMigrated: a hook or handler that names a table of the user's
// that does not exist fails as itself, not as a database nudge has not migrated.
func TestUsersMissingTableIsNotNotMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	missing := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO nudge_projections_of_mine VALUES (1)`)
		return err
	}
	withInit, err := projection.New("with_init", projection.Config{
		InitFunc: func(ctx context.Context, p projection.HookParams) error { return missing(ctx, p.Tx) },
	}, projection.OnAnyIdempotent(func(context.Context, eventstore.Event) error { return nil }))
	require.NoError(t, err)
	r, err := projection.NewRunner(e.backend, projection.RunnerConfig{}, withInit)
	require.NoError(t, err)
	err = r.Init(ctx)
	require.ErrorContains(t, err, `relation "nudge_projections_of_mine" does not exist`)
	require.NotErrorIs(t, err, projection.ErrNotMigrated)

	handler, err := projection.New("handler", projection.Config{},
		projection.On("A", func(ctx context.Context, tx pgx.Tx, _ projection.Event[projectiontest.Payload]) error {
			return missing(ctx, tx)
		}))
	require.NoError(t, err)
	r, err = projection.NewRunner(e.backend, projection.RunnerConfig{}, handler)
	require.NoError(t, err)
	require.NoError(t, r.Init(ctx))
	res, err := e.store.Append(ctx, "s", eventstore.Any, storetest.Event("A", 1))
	require.NoError(t, err)
	storetest.Settle(t, e.store, res.Last())
	_, err = r.CatchUp(ctx, "handler")
	require.ErrorIs(t, err, projection.ErrHandler)
	require.NotErrorIs(t, err, projection.ErrNotMigrated)
}
