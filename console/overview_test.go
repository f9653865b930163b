package console_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/console"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/projection"
)

// TestOverviewPartitioned: the overview folds a partitioned projection into one row that
// counts its partitions and says none is owned (no worker runs); its page lists the
// partitions, each unowned; a projection that does not exist is a 404.
func TestOverviewPartitioned(t *testing.T) {
	t.Parallel()
	pool := testPool(t)
	ctx := t.Context()
	_, backend := newBackend(ctx, t, pool)
	for _, cfg := range []struct {
		name  string
		parts int
	}{{"orders", 4}, {"plain", 0}} {
		p, err := projection.New(cfg.name, projection.Config{Partitions: cfg.parts},
			projection.OnIdempotent("X", func(context.Context, projection.Event[struct{}]) error { return nil }))
		require.NoError(t, err)
		require.NoError(t, backend.Register(ctx, p, nil))
	}
	h, err := console.New(console.Config{DB: pool, Logger: testlog.New(t)})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	body := get(t, srv.URL+"/")
	require.Equal(t, 2, strings.Count(body, "data-projection="), "one row per projection, partitions folded: %s", body)
	require.Contains(t, body, `data-projection="orders"`)
	require.Contains(t, body, "<td>4, 4 unowned</td>")
	require.Contains(t, get(t, srv.URL+"/live/overview"), `data-projection="plain"`)

	page := get(t, srv.URL+"/projections/orders")
	require.Contains(t, page, `id="partitions"`)
	require.Equal(t, 4, strings.Count(page, "<td>unowned</td>"), page)

	resp, err := srv.Client().Get(srv.URL + "/projections/nothing_here")
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, 404, resp.StatusCode)
}
