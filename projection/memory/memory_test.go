package memory_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	memstore "github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/memory"
	"github.com/nudgeworks/nudge/projection/projectiontest"
)

func newBackend(t *testing.T) (*memstore.Store, *memory.Backend) {
	t.Helper()
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	b, err := memory.New(store, memory.Config{})
	require.NoError(t, err)
	return store, b
}

func TestSuite(t *testing.T) {
	t.Parallel()
	projectiontest.Run(t, func(t *testing.T) projectiontest.Env {
		store, b := newBackend(t)
		return projectiontest.Env{Store: store, Backend: b}
	})
}

func TestRefusesTransactionalHandlers(t *testing.T) {
	t.Parallel()
	_, b := newBackend(t)
	p, err := projection.New("sql-model", projection.Config{}, projection.On("A",
		func(context.Context, pgx.Tx, projection.Event[projectiontest.Payload]) error { return nil }))
	require.NoError(t, err)
	r, err := projection.NewRunner(b, projection.RunnerConfig{Logger: testlog.New(t)}, p)
	require.NoError(t, err)
	err = r.Init(context.Background())
	require.ErrorIs(t, err, projection.ErrNeedsTransaction)
	require.ErrorContains(t, err, "OnIdempotent")

	_, err = memory.New(nil, memory.Config{})
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
}

// TestConfig: WithDefaults fills NowFunc; New refuses a nil store and a Config that cannot work
// with an error matching ErrInvalidConfig (and projection.ErrInvalidConfig).
func TestConfig(t *testing.T) {
	t.Parallel()
	cfg := memory.Config{}.WithDefaults()
	require.NotNil(t, cfg.NowFunc)
	require.NoError(t, cfg.Validate())
	require.ErrorIs(t, memory.Config{}.Validate(), memory.ErrInvalidConfig)

	_, err := memory.New(nil, memory.Config{})
	require.ErrorIs(t, err, memory.ErrInvalidConfig)
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
	require.ErrorContains(t, err, "memory event store")
}
