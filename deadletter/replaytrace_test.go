package deadletter_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/deadletter/deadlettertest"
	"github.com/nudgeworks/nudge/deadletter/memory"
	"github.com/nudgeworks/nudge/trigger"
)

// spanPublisher records the span context each trigger was published in.
type spanPublisher struct{ published []trace.SpanContext }

func (p *spanPublisher) Publish(ctx context.Context, _ trigger.Trigger) error {
	p.published = append(p.published, trace.SpanContextFromContext(ctx))
	return nil
}

// TestReplaySpan: every Replay — the console's, the CLI's and a program's, not only the
// client's and the worker's — runs in a nudge.deadletter.replay span, a child of the caller's,
// that names who replayed what; the replay triggers are published inside it, so their trigger
// spans continue its trace.
func TestReplaySpan(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	s := memory.New(memory.Config{})
	ctx := context.Background()
	_, err := s.Add(ctx, deadlettertest.EventEntry("tickets", uuid.New(), deadlettertest.Base()))
	require.NoError(t, err)

	ctx, caller := tp.Tracer("caller").Start(ctx, "POST /console/projections/tickets/replay")
	pub := &spanPublisher{}
	res, err := deadletter.Replay(ctx, s, pub, deadletter.ReplayFilter{Projection: "tickets"}, "ann", time.Time{},
		deadletter.WithTracerProvider(tp))
	require.NoError(t, err)
	require.Equal(t, 1, res.Replayed)
	caller.End()

	var replay sdktrace.ReadOnlySpan
	for _, sp := range rec.Ended() {
		if sp.Name() == "nudge.deadletter.replay" {
			replay = sp
		}
	}
	require.NotNil(t, replay, "a replay span")
	require.Equal(t, caller.SpanContext().SpanID(), replay.Parent().SpanID(), "a child of the caller's span")
	require.Equal(t, trace.SpanKindProducer, replay.SpanKind())
	attrs := map[string]any{}
	for _, a := range replay.Attributes() {
		attrs[string(a.Key)] = a.Value.AsInterface()
	}
	require.Equal(t, "ann", attrs["nudge.by"])
	require.Equal(t, int64(1), attrs["nudge.count"])
	require.Equal(t, "tickets", attrs["nudge.projection"])
	require.Equal(t, []string{"tickets"}, attrs["nudge.projections"])
	require.Len(t, pub.published, 1)
	require.Equal(t, replay.SpanContext().SpanID(), pub.published[0].SpanID(), "the trigger is published inside the replay's span")
}
