package postgres_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/pgtest"
)

// TestNotMigrated: every call on a database (or schema) where Migrate never ran fails with
// ErrNotMigrated, which says what to do; Migrate then makes the same store work.
func TestNotMigrated(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	for _, schema := range []string{"", "events"} {
		s, err := postgres.New(db.Pool, postgres.Config{Schema: schema})
		require.NoError(t, err)

		_, err = s.Append(ctx, "s", eventstore.Any, storetest.Event("A", 1))
		require.ErrorIs(t, err, eventstore.ErrNotMigrated, "schema %q", schema)
		require.ErrorContains(t, err, "run Migrate on the store (eventstore/postgres Store.Migrate) or `nudge migrate` first")
		require.NotErrorIs(t, err, eventstore.ErrConflict, "not retried as a conflict")

		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = s.AppendTx(ctx, tx, "s", eventstore.Any, storetest.Event("A", 1))
		require.ErrorIs(t, err, eventstore.ErrNotMigrated)
		require.NoError(t, tx.Rollback(ctx))

		_, err = s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{})
		require.ErrorIs(t, err, eventstore.ErrNotMigrated)
		_, err = s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{Types: []string{"A"}})
		require.ErrorIs(t, err, eventstore.ErrNotMigrated)
		_, err = s.ReadStream(ctx, "s", 0, 0)
		require.ErrorIs(t, err, eventstore.ErrNotMigrated)
		_, err = s.Head(ctx)
		require.ErrorIs(t, err, eventstore.ErrNotMigrated)
		_, err = s.HorizonHolder(ctx)
		require.ErrorIs(t, err, eventstore.ErrNotMigrated)

		require.NoError(t, s.Migrate(ctx))
		_, err = s.Append(ctx, "s", eventstore.Any, storetest.Event("A", 1))
		require.NoError(t, err)
	}
}
