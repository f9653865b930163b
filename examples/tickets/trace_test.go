package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestIncomingTraceContext: a request that carries a traceparent header (a caller that traces)
// gets its append's span in the caller's trace, a child of the caller's span, and the batches
// that project the ticket link to that append.
func TestIncomingTraceContext(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, ChannelPostgres)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	cfg := e.config(ModeAll)
	cfg.TracerProvider = tp
	api := e.start(cfg)

	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		spanID  = "00f067aa0ba902b7"
	)
	req, err := http.NewRequest(http.MethodPost, api.server.URL+"/tickets", strings.NewReader(bodyPrinter))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+traceID+"-"+spanID+"-01")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusCreated, res.StatusCode)

	var appendSpan trace.SpanContext
	require.Eventually(t, func() bool {
		for _, sp := range rec.Ended() {
			if sp.Name() == "nudge.append" && sp.SpanContext().TraceID().String() == traceID {
				require.Equal(t, spanID, sp.Parent().SpanID().String(), "the append's span is a child of the caller's")
				require.True(t, sp.Parent().IsRemote())
				appendSpan = sp.SpanContext()
			}
		}
		if !appendSpan.IsValid() {
			return false
		}
		for _, sp := range rec.Ended() {
			if sp.Name() != "nudge.batch" {
				continue
			}
			for _, l := range sp.Links() {
				if l.SpanContext.SpanID() == appendSpan.SpanID() {
					return true
				}
			}
		}
		return false
	}, waitFor, 10*time.Millisecond, "the append joins the caller's trace and a batch links to it")
}
