package main

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/projection"
)

// TestDropRetired: drop-retired drops a retired version's table (its recorded stable name's
// versioned table) at once, keeps its status row, does nothing the second time, and refuses the
// active version, a building one and an unknown name.
func TestDropRetired(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	_, backend := appendToOrder(t, f, "A", "A")
	start := func(p *projection.Projection) *projection.Runner {
		r, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: slog.New(slog.DiscardHandler)}, p)
		require.NoError(t, err)
		require.NoError(t, r.Init(ctx))
		_, err = r.CatchUp(ctx, p.Name())
		require.NoError(t, err)
		return r
	}
	table := func(name string) bool {
		var exists bool
		require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists))
		return exists
	}
	start(ordersVersion(t, 1))
	neu, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: slog.New(slog.DiscardHandler)}, ordersVersion(t, 2))
	require.NoError(t, err)
	require.NoError(t, neu.Init(ctx))

	out := runCLI(t, f.env, "drop-retired", "orders.v2")
	require.Equal(t, 1, out.code)
	require.Contains(t, out.stderr, "projection orders.v2 (version 2) is building, not retired")
	_, err = neu.CatchUp(ctx, "orders.v2") // cuts over: version 1 is retired
	require.NoError(t, err)
	out = runCLI(t, f.env, "drop-retired", "orders.v2")
	require.Equal(t, 1, out.code)
	require.Contains(t, out.stderr, "is active, not retired")
	require.True(t, table("orders_v2"))

	require.True(t, table("orders_v1"), "kept for its RetireGrace")
	out = runCLI(t, f.env, "drop-retired", "orders")
	require.Equal(t, 0, out.code, out.stderr)
	require.Contains(t, out.stdout, "dropped the read model of orders, version 1 of orders (retired at ")
	require.False(t, table("orders_v1"))
	require.True(t, table("orders_v2"))
	require.True(t, table("orders"), "the view of the active version stays")
	st, err := backend.StatusOf(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, projection.VersionRetired, st.VersionState, "its status row stays")
	out = runCLI(t, f.env, "drop-retired", "orders")
	require.Equal(t, 0, out.code, "dropped once; again is a no-op: %s", out.stderr)

	out = runCLI(t, f.env, "drop-retired", "nothing_here")
	require.Equal(t, 1, out.code)
	require.Contains(t, out.stderr, "no projection named nothing_here")
	out = runCLI(t, f.env, "drop-retired")
	require.Equal(t, 2, out.code)
}
