package nudge_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/nudgeworks/nudge"
	"github.com/nudgeworks/nudge/channel"
	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	"github.com/nudgeworks/nudge/channel/gochannel"
	pgchannel "github.com/nudgeworks/nudge/channel/postgres"
	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/retry"
)

// TestTracing: one append inside a request's span (Append, or AppendTx in the request's
// transaction), on each channel, gives an append span (a child of the request's), the
// trigger's publish (the relay's span, or the append's own with triggers in the transaction), a
// trigger span whose parent came through the broker, and a batch span, the trigger span's
// child, linked to the append span, with the right attributes.
func TestTracing(t *testing.T) {
	t.Parallel()
	stories := []tracedStory{
		{story: story{"gochannel", nudge.TriggersRelay, false}},
		{story: story{"amqp", nudge.TriggersRelay, false}},
		{story: story{"postgres", nudge.TriggersRelay, false}},
		{story: story{"postgres", nudge.TriggersInTransaction, false}},
		{story: story{"amqp", nudge.TriggersRelay, false}, appendTx: true},
		{story: story{"postgres", nudge.TriggersInTransaction, false}, appendTx: true},
	}
	for _, s := range stories {
		t.Run(fmt.Sprintf("%s/%s/append-tx=%t", s.channel, s.triggers, s.appendTx), func(t *testing.T) {
			t.Parallel()
			tracingStory(t, s)
		})
	}
}

// tracedStory is a story of TestTracing; appendTx: the request appends with AppendTx.
type tracedStory struct {
	story
	appendTx bool
}

func tracingStory(t *testing.T, s tracedStory) {
	ctx := context.Background()
	db := pgtest.New(t)
	pool := db.NewPool(t, 16)
	logger := testlog.New(t)
	var ch channel.Channel
	switch s.channel {
	case "gochannel":
		c, err := gochannel.New(gochannel.Config{})
		require.NoError(t, err)
		ch = c
	case "amqp":
		env := amqptest.New(t)
		c, err := amqpchannel.New(ctx, amqpchannel.Config{URL: env.URL, Prefix: env.Prefix, ConnectionName: env.ConnectionName, Logger: logger})
		require.NoError(t, err)
		ch = c
	case "postgres":
		c, err := pgchannel.New(pool, pgchannel.Config{PollInterval: 10 * time.Millisecond, Logger: logger})
		require.NoError(t, err)
		ch = c
	}
	t.Cleanup(func() { require.NoError(t, ch.Close()) })
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	lines := &logLines{}
	cfg := nudge.Config{
		Channel: ch, Projections: []*projection.Projection{ticketList(t)}, Triggers: s.triggers,
		Logger:            slog.New(slog.NewJSONHandler(lines, &slog.HandlerOptions{Level: slog.LevelDebug})),
		SafetyNetInterval: -1, TracerProvider: tp,
	}
	client := start(t, pool, cfg, false)
	// The catch-up at start (no trigger) is over before the append: the append's batch is a
	// trigger's.
	require.Eventually(t, func() bool { return len(find(spans, "nudge.batch", "ticket_list")) > 0 }, eventually, 5*time.Millisecond, "the catch-up at start")

	reqCtx, req := tp.Tracer("test").Start(ctx, "request")
	data, err := eventstore.NewEventData("TicketRegistered", ticketRegistered{ID: "1", Type: "bug"})
	require.NoError(t, err)
	var res eventstore.AppendResult
	if s.appendTx {
		tx, err := pool.Begin(reqCtx)
		require.NoError(t, err)
		res, err = client.AppendTx(reqCtx, tx, "ticket-1", eventstore.NoStream, data)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(reqCtx))
	} else {
		res, err = client.Append(reqCtx, "ticket-1", eventstore.NoStream, data)
		require.NoError(t, err)
	}
	req.End()
	require.Contains(t, string(res.Events[0].Metadata), req.SpanContext().TraceID().String(), "the event keeps the request's trace context")

	var batch sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		for _, b := range find(spans, "nudge.batch", "ticket_list") {
			if attr(b, "nudge.outcome") == "committed" {
				batch = b
				return true
			}
		}
		return false
	}, eventually, 5*time.Millisecond, "the batch that projects the append")

	appends := find(spans, "nudge.append", "")
	require.Len(t, appends, 1)
	appendSpan := appends[0]
	require.Equal(t, req.SpanContext().SpanID(), appendSpan.Parent().SpanID(), "the append is the request's child")
	require.Equal(t, "ticket-1", attr(appendSpan, "nudge.stream"))
	require.Equal(t, "1", attr(appendSpan, "nudge.events"))
	require.Equal(t, res.Last().String(), attr(appendSpan, "nudge.position.to"))

	require.Len(t, batch.Links(), 1, "the batch links to the append")
	require.Equal(t, appendSpan.SpanContext().SpanID(), batch.Links()[0].SpanContext.SpanID())
	require.Equal(t, appendSpan.SpanContext().TraceID(), batch.Links()[0].SpanContext.TraceID())
	require.Equal(t, "1", attr(batch, "nudge.events"))
	require.Equal(t, res.Last().String(), attr(batch, "nudge.position.to"))
	require.NotEmpty(t, attr(batch, "nudge.position.from"))
	require.NotEmpty(t, attr(batch, "nudge.lock.wait_seconds"))

	committed := lines.find(t, "projection batch committed", "ticket_list")
	require.Equal(t, batch.SpanContext().TraceID().String(), committed["trace_id"], "the batch's log line joins its trace")
	require.Equal(t, batch.SpanContext().SpanID().String(), committed["span_id"])

	// A span is recorded when it ends: the trigger's ends after its batch, the relay's publish
	// may end after the trigger arrived.
	var trig, publisher sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool { trig = byID(spans, batch.Parent().SpanID()); return trig != nil },
		eventually, 5*time.Millisecond, "the batch runs in a trigger's span")
	require.Equal(t, "nudge.trigger", trig.Name())
	require.Equal(t, trace.SpanKindConsumer, trig.SpanKind())
	require.Equal(t, "ticket_list", attr(trig, "nudge.projection"))
	require.Equal(t, "append", attr(trig, "nudge.trigger.reason"))
	require.True(t, trig.Parent().IsRemote(), "the trigger's parent came through the broker")
	require.Eventually(t, func() bool { publisher = byID(spans, trig.Parent().SpanID()); return publisher != nil },
		eventually, 5*time.Millisecond, "the trigger span's parent is a span of the test's")
	if s.triggers == nudge.TriggersInTransaction {
		require.Equal(t, appendSpan.SpanContext().SpanID(), publisher.SpanContext().SpanID(), "the append published the trigger")
		return
	}
	require.Equal(t, "nudge.relay.publish", publisher.Name())
	require.Equal(t, trace.SpanKindProducer, publisher.SpanKind())
	require.Equal(t, res.Last().String(), attr(publisher, "nudge.position.to"))
}

// logLines collects JSON log lines.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logLines) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// find returns the first line about projection whose msg is msg.
func (b *logLines) find(t *testing.T, msg, projection string) map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for line := range bytes.Lines(b.buf.Bytes()) {
		var fields map[string]any
		require.NoError(t, json.Unmarshal(line, &fields))
		if fields["msg"] == msg && fields["projection"] == projection {
			return fields
		}
	}
	t.Fatalf("no log line %q", msg)
	return nil
}

// find returns the ended spans named name (with nudge.projection projection, if not "").
func find(spans *tracetest.SpanRecorder, name, projection string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.Name() == name && (projection == "" || attr(s, "nudge.projection") == projection) {
			out = append(out, s)
		}
	}
	return out
}

// byID returns the ended span id, or nil.
func byID(spans *tracetest.SpanRecorder, id trace.SpanID) sdktrace.ReadOnlySpan {
	for _, s := range spans.Ended() {
		if s.SpanContext().SpanID() == id {
			return s
		}
	}
	return nil
}

// attr returns the span's attribute key as text ("" if unset).
func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if kv.Key == attribute.Key(key) {
			return kv.Value.String()
		}
	}
	return ""
}

// TestTracingHandlerFailure: the replay of dead letters at start has a span; a handler's failure
// is an event of its batch's span, which ends failed; the redrive of the parked stream after the
// fix has a span of its own.
func TestTracingHandlerFailure(t *testing.T) {
	t.Parallel()
	var fixed atomic.Bool
	list, err := projection.New("ticket_list", projection.Config{OnFailure: projection.OnFailurePark},
		projection.OnIdempotent("TicketRegistered", func(context.Context, projection.Event[ticketRegistered]) error {
			if !fixed.Load() {
				return retry.Permanent(errors.New("no such ticket type"))
			}
			return nil
		}))
	require.NoError(t, err)
	ch, err := gochannel.New(gochannel.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	client, err := nudge.NewInMemory(nudge.Config{Channel: ch, Projections: []*projection.Projection{list}, Logger: testlog.New(t),
		SafetyNetInterval: -1, TracerProvider: tp, Retry: retry.Policy{MaxAttempts: 1}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- client.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	<-client.Running()

	require.Eventually(t, func() bool { return len(find(spans, "nudge.deadletter.replay", "ticket_list")) == 1 },
		eventually, 5*time.Millisecond, "the replay at start")
	replay := find(spans, "nudge.deadletter.replay", "ticket_list")[0]
	require.Equal(t, "0", attr(replay, "nudge.count"))
	require.Equal(t, "worker start", attr(replay, "nudge.by"))

	data, err := eventstore.NewEventData("TicketRegistered", ticketRegistered{ID: "1", Type: "bug"})
	require.NoError(t, err)
	res, err := client.Append(ctx, "ticket-1", eventstore.NoStream, data)
	require.NoError(t, err)
	var failed sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		for _, b := range find(spans, "nudge.batch", "ticket_list") {
			if attr(b, "nudge.outcome") == "failed" {
				failed = b
				return true
			}
		}
		return false
	}, eventually, 5*time.Millisecond, "the failed batch")
	require.Equal(t, codes.Error, failed.Status().Code)
	require.NotEmpty(t, failed.Events())
	ev := failed.Events()[0]
	require.Equal(t, "nudge.handler.failed", ev.Name)
	got := map[attribute.Key]string{}
	for _, kv := range ev.Attributes {
		got[kv.Key] = kv.Value.String()
	}
	require.Equal(t, res.Events[0].ID.String(), got["nudge.event.id"])
	require.Equal(t, "TicketRegistered", got["nudge.event.type"])
	require.Equal(t, "no such ticket type", got["error"])

	require.Eventually(t, func() bool {
		parked, err := client.Parked(ctx, "ticket_list")
		require.NoError(t, err)
		return len(parked) == 1
	}, eventually, 5*time.Millisecond, "the stream is parked")
	fixed.Store(true)
	n, err := client.Redrive(ctx, "ticket_list", "ticket-1", "ann")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	// The worker's own redrive at start may run after the stream parked (it did not wait for
	// it): count ann's.
	var redrives []sdktrace.ReadOnlySpan
	for _, s := range find(spans, "nudge.redrive", "ticket_list") {
		if attr(s, "nudge.by") == "ann" {
			redrives = append(redrives, s)
		}
	}
	require.Len(t, redrives, 1)
	require.Equal(t, "ticket-1", attr(redrives[0], "nudge.stream"))
	require.Equal(t, "1", attr(redrives[0], "nudge.events"))
}

// TestTracingReplay: the log lines about a failing trigger (the batch's failure, the dead
// letter) carry its trace's ids; an operator's replay (Client.Replay) has a span naming who
// replayed what; the replayed trigger's span is its child, across the channel, and the batch
// that then projects the fixed event is the trigger's.
func TestTracingReplay(t *testing.T) {
	t.Parallel()
	var fixed atomic.Bool
	list, err := projection.New("ticket_list", projection.Config{},
		projection.OnIdempotent("TicketRegistered", func(context.Context, projection.Event[ticketRegistered]) error {
			if !fixed.Load() {
				return retry.Permanent(errors.New("no such ticket type"))
			}
			return nil
		}))
	require.NoError(t, err)
	ch, err := gochannel.New(gochannel.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	lines := &logLines{}
	client, err := nudge.NewInMemory(nudge.Config{Channel: ch, Projections: []*projection.Projection{list},
		Logger:            slog.New(slog.NewJSONHandler(lines, &slog.HandlerOptions{Level: slog.LevelDebug})),
		SafetyNetInterval: -1, TracerProvider: tp, Retry: retry.Policy{MaxAttempts: 1}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- client.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	<-client.Running()

	data, err := eventstore.NewEventData("TicketRegistered", ticketRegistered{ID: "1", Type: "bug"})
	require.NoError(t, err)
	_, err = client.Append(ctx, "ticket-1", eventstore.NoStream, data)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		recs, err := client.DeadLetters().List(ctx, deadletter.Filter{Projection: "ticket_list", Status: []deadletter.Status{deadletter.StatusFailed}})
		require.NoError(t, err)
		return len(recs) == 1
	}, eventually, 5*time.Millisecond, "the trigger is dead-lettered")
	var failedTrigger sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		for _, trig := range find(spans, "nudge.trigger", "ticket_list") {
			if trig.Status().Code == codes.Error {
				failedTrigger = trig
				return true
			}
		}
		return false
	}, eventually, 5*time.Millisecond, "the failed trigger's span")
	dead := lines.find(t, "trigger dead-lettered", "ticket_list")
	require.Equal(t, failedTrigger.SpanContext().TraceID().String(), dead["trace_id"], "the dead letter's line joins the trigger's trace")
	require.Equal(t, failedTrigger.SpanContext().SpanID().String(), dead["span_id"])
	// The failure's line names its batch's span (the trigger's child; a root span when the
	// catch-up at start met the event first).
	failedBatches := map[string]string{}
	for _, b := range find(spans, "nudge.batch", "ticket_list") {
		if attr(b, "nudge.outcome") == "failed" {
			failedBatches[b.SpanContext().SpanID().String()] = b.SpanContext().TraceID().String()
		}
	}
	failure := lines.find(t, "projection failed on an event; position stays before it", "ticket_list")
	require.Contains(t, failedBatches, failure["span_id"], "the failure's line names a failed batch's span")
	require.Equal(t, failedBatches[failure["span_id"].(string)], failure["trace_id"])

	fixed.Store(true)
	res, err := client.Replay(ctx, deadletter.ReplayFilter{Projection: "ticket_list"}, "ann")
	require.NoError(t, err)
	require.Equal(t, 1, res.Replayed)
	var replay sdktrace.ReadOnlySpan
	for _, s := range find(spans, "nudge.deadletter.replay", "") {
		if attr(s, "nudge.by") == "ann" {
			replay = s
		}
	}
	require.NotNil(t, replay, "the operator's replay has a span")
	require.Equal(t, trace.SpanKindProducer, replay.SpanKind())
	require.Equal(t, "ticket_list", attr(replay, "nudge.projection"))
	require.Equal(t, "1", attr(replay, "nudge.count"))

	var batch sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		for _, trig := range find(spans, "nudge.trigger", "ticket_list") {
			if attr(trig, "nudge.trigger.reason") != "replay" || trig.Parent().SpanID() != replay.SpanContext().SpanID() {
				continue
			}
			for _, b := range find(spans, "nudge.batch", "ticket_list") {
				if b.Parent().SpanID() == trig.SpanContext().SpanID() && attr(b, "nudge.outcome") == "committed" {
					batch = b
					return true
				}
			}
		}
		return false
	}, eventually, 5*time.Millisecond, "the replayed trigger's span, the replay's child, and its committed batch")
	require.Equal(t, replay.SpanContext().TraceID(), batch.SpanContext().TraceID())
}

// TestReplayWithoutChannel: a client without a channel cannot publish a replay's triggers.
func TestReplayWithoutChannel(t *testing.T) {
	t.Parallel()
	client, err := nudge.NewInMemory(nudge.Config{Projections: []*projection.Projection{ticketList(t)}, Logger: testlog.New(t)})
	require.NoError(t, err)
	_, err = client.Replay(context.Background(), deadletter.ReplayFilter{All: true}, "ann")
	require.ErrorIs(t, err, nudge.ErrNoChannel)
}
