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

// newStore returns a migrated store on a database of the test's own.
func newStore(t testing.TB, cfg postgres.Config) (*postgres.Store, *pgtest.DB) {
	t.Helper()
	db := pgtest.New(t)
	s, err := postgres.New(db.Pool, cfg)
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
	return s, db
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
