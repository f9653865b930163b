package console_test

import (
	"context"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/console"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/projection"
)

// TestOverviewThroughput: the overview and the projection page show a projection's throughput,
// the growth of its processed events between two reads of its status: unknown at the first
// read, then events per second; a reset of the count makes it unknown again.
func TestOverviewThroughput(t *testing.T) {
	t.Parallel()
	pool := testPool(t)
	ctx := t.Context()
	_, backend := newBackend(ctx, t, pool)
	p, err := projection.New("orders", projection.Config{},
		projection.OnIdempotent("X", func(context.Context, projection.Event[struct{}]) error { return nil }))
	require.NoError(t, err)
	require.NoError(t, backend.Register(ctx, p, nil))

	h, err := console.New(console.Config{DB: pool, Logger: testlog.New(t)})
	require.NoError(t, err)
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	console.SetClock(h, func() time.Time { return time.Unix(0, now.Load()).UTC() })
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	processed := func(sql string) {
		_, err := pool.Exec(ctx, `UPDATE nudge_projections SET events_processed = `+sql+` WHERE name = 'orders'`)
		require.NoError(t, err)
	}

	require.Contains(t, get(t, srv.URL+"/"), `<th>Throughput</th>`)
	require.Contains(t, get(t, srv.URL+"/"), `<td class="throughput">–</td>`, "unknown at the first read")

	processed("events_processed + 500")
	now.Add(int64(10 * time.Second))
	require.Contains(t, get(t, srv.URL+"/live/overview"), `<td class="throughput">50/s</td>`)
	require.Contains(t, get(t, srv.URL+"/projections/orders"), `<dd id="throughput">50/s</dd>`, "the page, at the same time")

	processed("events_processed + 3")
	now.Add(int64(2 * time.Second))
	require.Contains(t, get(t, srv.URL+"/"), `<td class="throughput">1.5/s</td>`)

	processed("0") // a rebuild starts the count again
	now.Add(int64(2 * time.Second))
	require.Contains(t, get(t, srv.URL+"/"), `<td class="throughput">–</td>`, "unknown after a reset")
}
