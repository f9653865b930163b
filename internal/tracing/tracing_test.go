package tracing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/tracing"
)

// TestOffAllocatesNothing: with no provider set (the global no-op) or a noop provider, a span's
// start, attributes guarded by IsRecording, its end and the trace context's injection into a
// message allocate nothing.
func TestOffAllocatesNothing(t *testing.T) {
	metadata := map[string]string{}
	for name, tr := range map[string]*tracing.Tracer{"global": tracing.New(nil), "noop": tracing.New(noop.NewTracerProvider()), "nil": nil} {
		allocs := testing.AllocsPerRun(1000, func() {
			ctx, span := tr.Start(context.Background(), tracing.SpanBatch, trace.SpanKindInternal)
			if span.IsRecording() {
				span.SetAttributes(tracing.AttrProjection.String("p"))
			}
			tracing.Inject(ctx, metadata)
			_ = tracing.Extract(ctx, metadata)
			tracing.End(span, nil)
		})
		require.Zero(t, allocs, name)
		require.Empty(t, metadata, name)
	}
}

func recorder(t *testing.T) (*tracetest.SpanRecorder, trace.TracerProvider) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	return spans, tp
}

// TestEventLinks: the trace context an append stores in its events' metadata (kept beside the
// caller's fields; metadata that is not an object stays as it was) becomes the batch span's
// links, one per appending span, at most MaxLinks.
func TestEventLinks(t *testing.T) {
	spans, tp := recorder(t)
	tr := tracing.New(tp)
	var events []eventstore.Event
	var appended []trace.SpanContext
	for i := range tracing.MaxLinks + 3 {
		ctx, span := tr.Start(context.Background(), tracing.SpanAppend, trace.SpanKindProducer)
		meta := json.RawMessage(`{"actor":"ann"}`)
		switch i {
		case 1:
			meta = nil
		case 2:
			meta = json.RawMessage(`[1]`)
		}
		data := tracing.WithTraceContext(ctx, []eventstore.EventData{{Type: "T", Metadata: meta}, {Type: "T", Metadata: meta}})
		span.End()
		for _, d := range data {
			events = append(events, eventstore.Event{Type: d.Type, Metadata: d.Metadata})
		}
		switch i {
		case 0:
			var fields map[string]string
			require.NoError(t, json.Unmarshal(data[0].Metadata, &fields))
			require.Equal(t, "ann", fields["actor"])
			require.Contains(t, fields[tracing.KeyTraceparent], span.SpanContext().SpanID().String())
		case 2:
			require.JSONEq(t, `[1]`, string(data[0].Metadata), "not an object: unchanged")
			continue
		}
		appended = append(appended, span.SpanContext())
	}
	_, batch := tr.Start(context.Background(), tracing.SpanBatch, trace.SpanKindInternal)
	require.Equal(t, tracing.MaxLinks, tracing.LinkEvents(batch, events))
	batch.End()
	ended := spans.Ended()
	links := ended[len(ended)-1].Links()
	require.Len(t, links, tracing.MaxLinks)
	for i, l := range links {
		require.Equal(t, appended[i].SpanID(), l.SpanContext.SpanID())
	}
}

// TestGlobalProviderSetLater: a Tracer on the global provider follows one the application sets
// after the Tracer was made.
func TestGlobalProviderSetLater(t *testing.T) {
	tr := tracing.New(nil)
	require.False(t, tr.On())
	spans, tp := recorder(t)
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })
	require.True(t, tr.On())
	_, span := tr.Start(context.Background(), tracing.SpanTrigger, trace.SpanKindConsumer)
	span.End()
	require.Len(t, spans.Ended(), 1)
}

// TestLogger: a line logged with a context whose span is valid carries trace_id and span_id;
// one without carries neither.
func TestLogger(t *testing.T) {
	_, tp := recorder(t)
	var out bytes.Buffer
	log := tracing.Logger(slog.New(slog.NewJSONHandler(&out, nil))).With(slog.String("projection", "p"))
	require.Same(t, log, tracing.Logger(log))
	ctx, span := tp.Tracer("test").Start(context.Background(), "batch")
	log.InfoContext(ctx, "in a span")
	span.End()
	log.InfoContext(context.Background(), "outside")
	lines := bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n"))
	require.Len(t, lines, 2)
	var in, outside map[string]any
	require.NoError(t, json.Unmarshal(lines[0], &in))
	require.NoError(t, json.Unmarshal(lines[1], &outside))
	require.Equal(t, span.SpanContext().TraceID().String(), in[tracing.LogTraceID])
	require.Equal(t, span.SpanContext().SpanID().String(), in[tracing.LogSpanID])
	require.Equal(t, "p", in["projection"])
	require.NotContains(t, outside, tracing.LogTraceID)
	require.NotContains(t, outside, tracing.LogSpanID)
}

// TestWithTraceContext: the trace context joins the metadata's fields as valid JSON, whatever
// the object's shape; metadata with a traceparent of its own, or not an object, is kept.
func TestWithTraceContext(t *testing.T) {
	_, tp := recorder(t)
	ctx, span := tracing.New(tp).Start(context.Background(), tracing.SpanAppend, trace.SpanKindProducer)
	defer span.End()
	parent := span.SpanContext()
	for in, want := range map[string]map[string]any{
		``:                             {},
		`null`:                         {},
		`{}`:                           {},
		` { } `:                        {},
		`{"actor":"ann","n":[1,{}]}`:   {"actor": "ann", "n": []any{1.0, map[string]any{}}},
		`{"traceparent":"mine"}`:       nil,
		`{"x":{"traceparent":"deep"}}`: {"x": map[string]any{"traceparent": "deep"}},
		`[{"a":1}]`:                    nil,
		`"text"`:                       nil,
	} {
		data := tracing.WithTraceContext(ctx, []eventstore.EventData{{Metadata: json.RawMessage(in)}})
		if want == nil {
			require.Equal(t, in, string(data[0].Metadata), in)
			continue
		}
		var got map[string]any
		require.NoError(t, json.Unmarshal(data[0].Metadata, &got), in)
		require.Contains(t, got[tracing.KeyTraceparent], parent.SpanID().String(), in)
		delete(got, tracing.KeyTraceparent)
		require.Equal(t, want, got, in)
	}
	unsampled := trace.ContextWithSpanContext(context.Background(), parent.WithTraceFlags(0))
	events := []eventstore.EventData{{Metadata: json.RawMessage(`{}`)}}
	require.Equal(t, `{}`, string(tracing.WithTraceContext(unsampled, events)[0].Metadata), "not sampled: kept as is")
}
