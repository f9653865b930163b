package tracing

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/nudgeworks/nudge/eventstore"
)

// W3C trace-context keys, in Watermill metadata and in an event's metadata.
const (
	KeyTraceparent = "traceparent"
	KeyTracestate  = "tracestate"
)

var propagator = propagation.TraceContext{}

// Inject writes ctx's span context (W3C traceparent and tracestate) into a message's metadata;
// it writes nothing when ctx has no valid span context.
func Inject(ctx context.Context, metadata map[string]string) {
	if metadata == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	propagator.Inject(ctx, propagation.MapCarrier(metadata))
}

// Extract returns ctx with the remote span context a message's metadata carries, if any.
func Extract(ctx context.Context, metadata map[string]string) context.Context {
	if metadata[KeyTraceparent] == "" {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier(metadata))
}

// WithTraceContext returns the events to append, each one's metadata carrying ctx's trace
// context (traceparent, tracestate), when ctx's span is sampled; otherwise events unchanged.
// Metadata that is not a JSON object, or that has a traceparent already, is left alone. The
// caller's slice is never modified.
func WithTraceContext(ctx context.Context, events []eventstore.EventData) []eventstore.EventData {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || !sc.IsSampled() {
		return events
	}
	carrier := propagation.MapCarrier{}
	propagator.Inject(ctx, carrier)
	out := make([]eventstore.EventData, len(events))
	for i, e := range events {
		e.Metadata = withTraceContext(e.Metadata, carrier)
		out[i] = e
	}
	return out
}

func withTraceContext(metadata json.RawMessage, carrier propagation.MapCarrier) json.RawMessage {
	trimmed := bytes.TrimSpace(metadata)
	empty := len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null"))
	if !empty && (trimmed[0] != '{' || trimmed[len(trimmed)-1] != '}') {
		return metadata // not an object: nowhere to keep the trace context
	}
	if !empty && bytes.Contains(trimmed, []byte(`"`+KeyTraceparent+`"`)) {
		return mergeTraceContext(metadata, carrier)
	}
	// The fields in front of the object's own: {"traceparent":"…","tracestate":"…", …}.
	out := make([]byte, 0, len(trimmed)+len(carrier[KeyTraceparent])+len(carrier[KeyTracestate])+64)
	out = append(out, '{')
	for i, k := range []string{KeyTraceparent, KeyTracestate} {
		v := carrier[k]
		if v == "" {
			continue
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = strconv.AppendQuote(append(strconv.AppendQuote(out, k), ':'), v)
	}
	if empty {
		return append(out, '}')
	}
	rest := bytes.TrimSpace(trimmed[1:])
	if rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, rest...)
}

// mergeTraceContext adds the trace context to an object that may have a traceparent already
// (then it is left alone).
func mergeTraceContext(metadata json.RawMessage, carrier propagation.MapCarrier) json.RawMessage {
	fields := map[string]json.RawMessage{}
	if json.Unmarshal(metadata, &fields) != nil {
		return metadata
	}
	if _, set := fields[KeyTraceparent]; set {
		return metadata
	}
	for k, v := range carrier {
		b, err := json.Marshal(v)
		if err != nil {
			return metadata
		}
		fields[k] = b
	}
	b, err := json.Marshal(fields)
	if err != nil {
		return metadata
	}
	return b
}

// spanContextOf returns the span context an event's metadata carries (invalid if none).
func spanContextOf(metadata json.RawMessage) trace.SpanContext {
	if !bytes.Contains(metadata, []byte(`"`+KeyTraceparent+`"`)) {
		return trace.SpanContext{}
	}
	var fields struct {
		Traceparent string `json:"traceparent"`
		Tracestate  string `json:"tracestate"`
	}
	if json.Unmarshal(metadata, &fields) != nil || fields.Traceparent == "" {
		return trace.SpanContext{}
	}
	carrier := propagation.MapCarrier{KeyTraceparent: fields.Traceparent}
	if fields.Tracestate != "" {
		carrier[KeyTracestate] = fields.Tracestate
	}
	return trace.SpanContextFromContext(propagator.Extract(context.Background(), carrier))
}

// LinkEvents adds to span a link to the span that appended each event (its metadata's trace
// context), at most MaxLinks distinct ones, and returns how many it added. It does nothing
// unless span is recording.
func LinkEvents(span trace.Span, events []eventstore.Event) int {
	if !span.IsRecording() {
		return 0
	}
	var linked []trace.SpanContext
	for _, e := range events {
		if len(linked) == MaxLinks {
			break
		}
		sc := spanContextOf(e.Metadata)
		if !sc.IsValid() || containsSpan(linked, sc) {
			continue
		}
		linked = append(linked, sc)
		span.AddLink(trace.Link{SpanContext: sc})
	}
	return len(linked)
}

func containsSpan(scs []trace.SpanContext, sc trace.SpanContext) bool {
	for _, s := range scs {
		if s.TraceID() == sc.TraceID() && s.SpanID() == sc.SpanID() {
			return true
		}
	}
	return false
}
