package projection_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	memstore "github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/projection"
	pjmemory "github.com/nudgeworks/nudge/projection/memory"
)

// batchRunner returns a memory store and a runner of one projection on it, ready to catch up,
// with cfg.
func batchRunner(b *testing.B, cfg projection.RunnerConfig) (*memstore.Store, *projection.Runner) {
	b.Helper()
	store, err := memstore.New(memstore.Config{})
	require.NoError(b, err)
	backend, err := pjmemory.New(store, pjmemory.Config{})
	require.NoError(b, err)
	p, err := projection.New("bench", projection.Config{},
		projection.OnAnyIdempotent(func(context.Context, eventstore.Event) error { return nil }))
	require.NoError(b, err)
	runner, err := projection.NewRunner(backend, cfg, p)
	require.NoError(b, err)
	require.NoError(b, runner.Init(context.Background()))
	return store, runner
}

// benchmarkBatches appends one event and catches up (one batch) per iteration.
func benchmarkBatches(b *testing.B, store *memstore.Store, runner *projection.Runner) {
	ctx := context.Background()
	data := eventstore.EventData{Type: "T", Payload: []byte(`{}`)}
	b.ReportAllocs()
	for b.Loop() {
		_, err := store.Append(ctx, "s", eventstore.Any, data)
		require.NoError(b, err)
		res, err := runner.CatchUp(ctx, "bench")
		require.NoError(b, err)
		require.Equal(b, 1, res.Events)
	}
}

// BenchmarkBatchTracingOff: a batch with no TracerProvider set (the global no-op); compare
// its allocations with those before tracing existed.
func BenchmarkBatchTracingOff(b *testing.B) {
	store, runner := batchRunner(b, projection.RunnerConfig{})
	benchmarkBatches(b, store, runner)
}
