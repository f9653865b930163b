// Package tracing is nudge's OpenTelemetry instrumentation: a tracer that costs nothing when
// the application set no TracerProvider, the W3C trace context carried in Watermill metadata
// and in an event's metadata, the links from a batch to the appends of its events, and a log
// handler that adds the active span's ids to each line.
package tracing

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of every span nudge starts.
const ScopeName = "github.com/nudgeworks/nudge"

// Span names.
const (
	SpanAppend   = "nudge.append"
	SpanPublish  = "nudge.relay.publish"
	SpanTrigger  = "nudge.trigger"
	SpanBatch    = "nudge.batch"
	SpanCutOver  = "nudge.cutover"
	SpanRedrive  = "nudge.redrive"
	SpanReplay   = "nudge.deadletter.replay"
	MaxLinks     = 32 // links a batch span holds at most, to the appends of its events
	messagingSys = "nudge"
)

// globalDefault is the global TracerProvider before the application sets one: it starts
// non-recording spans, and allocates doing so.
var globalDefault = otel.GetTracerProvider()

// off is the span Start returns when tracing is off: not recording, and without allocating.
var off trace.Span = noop.Span{}

// NoSpan returns a span that records nothing, for work that is not traced.
func NoSpan() trace.Span { return off }

// Tracer starts nudge's spans through a TracerProvider. When the provider is a no-op (none
// was given and the application set no global one, or a noop.TracerProvider), Start returns ctx
// unchanged and a span that records nothing, allocating nothing. The zero Tracer and a nil
// *Tracer follow the global provider.
type Tracer struct {
	// tracer is the given provider's (nil: the global provider's, looked up at each Start, so
	// a provider the application sets later is used).
	tracer trace.Tracer
	// disabled: the given provider is a no-op.
	disabled bool
}

// New returns a Tracer on tp; nil follows otel.GetTracerProvider().
func New(tp trace.TracerProvider) *Tracer {
	switch tp.(type) {
	case nil:
		return &Tracer{}
	case noop.TracerProvider, *noop.TracerProvider:
		return &Tracer{disabled: true}
	}
	return &Tracer{tracer: tp.Tracer(ScopeName)}
}

// Start starts a span of kind named name, a child of ctx's span, unless tracing is off.
// Set attributes only when span.IsRecording(), so that tracing off costs nothing.
func (t *Tracer) Start(ctx context.Context, name string, kind trace.SpanKind) (context.Context, trace.Span) {
	tr := t.get()
	if tr == nil {
		return ctx, off
	}
	return tr.Start(ctx, name, trace.WithSpanKind(kind))
}

// On reports whether spans are recorded (the provider is not a no-op); callers use it to skip
// work that only tracing needs.
func (t *Tracer) On() bool { return t.get() != nil }

func (t *Tracer) get() trace.Tracer {
	switch {
	case t == nil:
	case t.disabled:
		return nil
	case t.tracer != nil:
		return t.tracer
	}
	tp := otel.GetTracerProvider()
	if tp == globalDefault {
		return nil
	}
	if _, ok := tp.(noop.TracerProvider); ok {
		return nil
	}
	return tp.Tracer(ScopeName)
}
