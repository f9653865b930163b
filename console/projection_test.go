package console_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/console"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/pgcluster"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
)

// TestProjectionPageBuildAndHolder: on a private cluster (the horizon is the cluster's), a
// rebuilding projection's page shows its progress and its time to level; a projection whose
// events wait behind an open transaction is held, and its page and the overview name the
// transaction's session.
func TestProjectionPageBuildAndHolder(t *testing.T) {
	c := pgcluster.ForTest(t)
	ctx := testwait.Context(t, time.Minute)
	pool, err := pgxpool.New(ctx, c.URL("postgres", ""))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, backend := newBackend(ctx, t, pool)
	for n, typ := range map[string]string{"orders": "A", "held": "B"} {
		p, err := projection.New(n, projection.Config{},
			projection.OnIdempotent(typ, func(context.Context, projection.Event[struct{}]) error { return nil }))
		require.NoError(t, err)
		require.NoError(t, backend.Register(ctx, p, nil))
	}
	for range 10 {
		_, err := store.Append(ctx, "order", eventstore.Any, eventstore.EventData{Type: "A", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	h, err := console.New(console.Config{DB: pool, Logger: testlog.New(t)})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	// Rebuilding for ten seconds, 5 events done, 10 to go: 0.5 events/s, level in 20 s.
	_, err = pool.Exec(ctx, `UPDATE nudge_projections SET state = 'rebuilding', events_processed = 5,
		rebuild_started_at = clock_timestamp() - interval '10 seconds' WHERE name = 'orders'`)
	require.NoError(t, err)
	page := get(t, srv.URL+"/projections/orders")
	require.Contains(t, page, `<dd id="progress">5 of 15 events, level in about 20s</dd>`)
	require.Contains(t, page, `<dd id="throughput">0.5/s</dd>`, "the average since the reset, before a rate is measured")
	require.NotContains(t, page, `id="holder"`)

	// An open transaction in another database holds back a committed event of type B.
	_, err = pool.Exec(ctx, `CREATE DATABASE reports`)
	require.NoError(t, err)
	report, err := pgx.Connect(ctx, c.URL("reports", ""))
	require.NoError(t, err)
	t.Cleanup(func() { _ = report.Close(context.Background()) })
	tx, err := report.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)
	_, err = store.Append(ctx, "order", eventstore.Any, eventstore.EventData{Type: "B", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)

	pid := strconv.Itoa(int(report.PgConn().PID()))
	page = get(t, srv.URL+"/projections/held")
	require.Contains(t, page, `<dd id="condition" class="c-held">held</dd>`)
	require.Regexp(t, `<dd id="holder">pid `+pid+` \(reports\)`, page)
	require.Regexp(t, `<td class="condition">held</td>(?s:.*)held by pid `+pid+` \(reports\)`, get(t, srv.URL+"/"))
}
