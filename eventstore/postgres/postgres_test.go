package postgres_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	nudgepg "github.com/nudgeworks/nudge/postgres"
)

// newStore returns a migrated store on a database of the test's own.
func newStore(t testing.TB, cfg postgres.Config) (*postgres.Store, *pgtest.DB) {
	t.Helper()
	db := pgtest.New(t)
	s, err := postgres.New(db.Pool, cfg)
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
	return s, db
}

// TestAccessors: the store tells the components that keep their tables beside its own
// (projection/postgres) its database and schema.
func TestAccessors(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s, err := postgres.New(db.Pool, postgres.Config{Schema: "ops"})
	require.NoError(t, err)
	require.Equal(t, nudgepg.DB(db.Pool), s.DB())
	require.Equal(t, "ops", s.Schema())
}

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T, limits eventstore.Limits) eventstore.Store {
		s, _ := newStore(t, postgres.Config{Limits: limits})
		return s
	})
}

func TestConformanceInSchema(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T, limits eventstore.Limits) eventstore.Store {
		s, _ := newStore(t, postgres.Config{Schema: "events", Limits: limits})
		return s
	})
}
