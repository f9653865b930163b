package projection_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/nudgeworks/nudge/projection"
)

// BenchmarkBatchTracingOn: a batch traced, sampled at 100 %, into an in-memory exporter.
func BenchmarkBatchTracingOn(b *testing.B) {
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSyncer(exporter))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	store, runner := batchRunner(b, projection.RunnerConfig{TracerProvider: tp})
	benchmarkBatches(b, store, runner)
	exporter.Reset()
}
