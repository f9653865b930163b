package nudge_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/nudgeworks/nudge"
)

// BenchmarkAppendTracingOn: an in-memory client's Append traced, sampled at 100 %, into an
// in-memory exporter, inside a request's span (so the events keep its trace context).
func BenchmarkAppendTracingOn(b *testing.B) {
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSyncer(exporter))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	client := memoryClient(b, nudge.Config{TracerProvider: tp})
	ctx, span := tp.Tracer("bench").Start(context.Background(), "request")
	defer span.End()
	benchmarkAppendCtx(ctx, b, client)
	exporter.Reset()
}
