package main

import (
	"context"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/tracing"
)

// tracer traces the live writers' appends as nudge.Client.Append does, through the global
// provider: a no-op unless -trace set one.
var tracer = tracing.New(nil)

// startTracing, for -trace, sets the global TracerProvider to one that samples every span
// and exports it to memory, emptied every second; it returns how many spans were exported
// and a stop func that restores the no-op.
func startTracing(ctx context.Context) (exported *atomic.Int64, stop func()) {
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(exporter))
	otel.SetTracerProvider(tp)
	exported = &atomic.Int64{}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				exported.Add(int64(len(exporter.GetSpans())))
				exporter.Reset()
			}
		}
	}()
	return exported, func() {
		_ = tp.Shutdown(context.Background()) // flushes the batcher
		otel.SetTracerProvider(noop.NewTracerProvider())
		cancel()
		<-done
		exported.Add(int64(len(exporter.GetSpans())))
	}
}

// appendTraced appends as nudge.Client.Append does: in a span whose trace context the events
// keep, when tracing is on.
func appendTraced(ctx context.Context, store interface {
	Append(ctx context.Context, streamID string, expected eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error)
}, stream string, events ...eventstore.EventData) (eventstore.AppendResult, error) {
	ctx, span := tracer.Start(ctx, tracing.SpanAppend, trace.SpanKindProducer)
	if !span.IsRecording() {
		return store.Append(ctx, stream, eventstore.Any, events...)
	}
	res, err := store.Append(ctx, stream, eventstore.Any, tracing.WithTraceContext(ctx, events)...)
	tracing.End(span, err)
	return res, err
}
