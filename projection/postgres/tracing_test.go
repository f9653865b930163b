package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
)

// TestCutOverSpan: a version's cut-over has a span naming the projection, the version and its
// outcome; the building version's batches have theirs.
func TestCutOverSpan(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testwait.Context(t, 3*time.Minute)
	noop := projection.OnIdempotent("Appended", func(context.Context, projection.Event[appended]) error { return nil })
	p, err := projection.New("plain", projection.Config{}, noop)
	require.NoError(t, err)
	r := runner(t, e.backend, p)
	appendSettled(ctx, t, e, 1, 1, false)
	_, err = r.CatchUp(ctx, "plain")
	require.NoError(t, err)

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	p2, err := projection.New("plain", projection.Config{Version: 2}, noop)
	require.NoError(t, err)
	r2, err := projection.NewRunner(e.backend, projection.RunnerConfig{Logger: testlog.New(t), TracerProvider: tp}, p2)
	require.NoError(t, err)
	require.NoError(t, r2.Init(ctx))
	res, err := r2.CatchUp(ctx, "plain.v2")
	require.NoError(t, err)
	require.True(t, res.Activated)

	var cutOvers, batches []sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		switch s.Name() {
		case "nudge.cutover":
			cutOvers = append(cutOvers, s)
		case "nudge.batch":
			batches = append(batches, s)
		}
	}
	require.Len(t, cutOvers, 1)
	attrs := attribute.NewSet(cutOvers[0].Attributes()...)
	outcome, _ := attrs.Value("nudge.outcome")
	version, _ := attrs.Value("nudge.version")
	name, _ := attrs.Value("nudge.projection")
	require.Equal(t, "activated", outcome.AsString())
	require.Equal(t, int64(2), version.AsInt64())
	require.Contains(t, name.AsString(), "plain")
	require.NotEmpty(t, batches, "the building version's batches")
}
