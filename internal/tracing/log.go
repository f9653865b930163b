package tracing

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// Log attribute keys of the active span's ids.
const (
	LogTraceID = "trace_id"
	LogSpanID  = "span_id"
)

// logHandler adds the trace and span ids of the context's span to each record.
type logHandler struct{ slog.Handler }

// Logger returns l with every line logged with a context (InfoContext, …) whose span context
// is valid carrying trace_id and span_id. A logger Logger returned is returned as is.
func Logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return nil
	}
	if _, ok := l.Handler().(logHandler); ok {
		return l
	}
	return slog.New(logHandler{l.Handler()})
}

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String(LogTraceID, sc.TraceID().String()), slog.String(LogSpanID, sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return logHandler{h.Handler.WithAttrs(attrs)}
}

func (h logHandler) WithGroup(name string) slog.Handler {
	return logHandler{h.Handler.WithGroup(name)}
}
