package metrics_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	dlpostgres "github.com/nudgeworks/nudge/deadletter/postgres"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/eventload"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/metrics"
	"github.com/nudgeworks/nudge/projection"
	pgproj "github.com/nudgeworks/nudge/projection/postgres"
)

// BenchmarkObserveBatch is the cost ObserveBatch adds to every batch (RunnerConfig.OnBatch).
func BenchmarkObserveBatch(b *testing.B) {
	m, err := metrics.New(metrics.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(b, err)
	report := projection.BatchReport{Projection: "ticket_list", Events: 500, Took: 12 * time.Millisecond}
	b.ReportAllocs()
	for b.Loop() {
		m.ObserveBatch(report)
	}
}

// BenchmarkScrapeOnPostgreSQL is one scrape (Gather) of WatchRunner and WatchDeadLetters on
// PostgreSQL: 10 projections, each NUDGE_BENCH_LAG events behind (10,000 by default; the lag
// is counted by the status query), and no cache.
func BenchmarkScrapeOnPostgreSQL(b *testing.B) {
	lag := 10_000
	if s := os.Getenv("NUDGE_BENCH_LAG"); s != "" {
		var err error
		lag, err = strconv.Atoi(s)
		require.NoError(b, err)
	}
	ctx := context.Background()
	db := pgtest.New(b)
	store, err := espg.New(db.Pool, espg.Config{})
	require.NoError(b, err)
	require.NoError(b, store.Migrate(ctx))
	backend, err := pgproj.New(store)
	require.NoError(b, err)
	require.NoError(b, backend.Migrate(ctx))
	dead, err := dlpostgres.New(db.Pool, dlpostgres.Config{})
	require.NoError(b, err)
	require.NoError(b, dead.Migrate(ctx))
	if lag > 0 {
		eventload.Load(b, db.Pool, lag, 100, "Registered", func(string, int) string { return `{"n":1}` })
	}

	var projections []*projection.Projection
	for i := range 10 {
		p, err := projection.New(fmt.Sprintf("p%d", i), projection.Config{},
			projection.OnIdempotent("Registered", func(context.Context, projection.Event[ticket]) error { return nil }))
		require.NoError(b, err)
		projections = append(projections, p)
	}
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{}, projections...)
	require.NoError(b, err)
	require.NoError(b, runner.Init(ctx))
	reg := prometheus.NewRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg, CacheTTL: -1, QueryTimeout: time.Minute})
	require.NoError(b, err)
	require.NoError(b, m.WatchRunner(runner))
	require.NoError(b, m.WatchDeadLetters(dead, runner.Names()...))
	require.Equal(b, float64(lag), mustValue(b, reg, "nudge_projection_lag_events", "projection", "p0"))

	for b.Loop() {
		if _, err := reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}
