package amqp_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
	dlmemory "github.com/nudgeworks/nudge/deadletter/memory"
	"github.com/nudgeworks/nudge/eventstore"
	esmemory "github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/projection"
	pjmemory "github.com/nudgeworks/nudge/projection/memory"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/trigger"
	"github.com/nudgeworks/nudge/worker"
)

// TestNoDeadLetterQueue: a worker dead-letters into its dead-letter store
// (worker.Config.DeadLetters, required) and never into the channel, so the channel declares no
// dead-letter queue.
func TestNoDeadLetterQueue(t *testing.T) {
	t.Parallel()
	env := amqptest.New(t)
	ch := newChannel(t, config(t, env))
	ctx := context.Background()
	logger := slog.New(slog.DiscardHandler)

	events, err := esmemory.New(esmemory.Config{})
	require.NoError(t, err)
	_, err = events.Append(ctx, "s-1", eventstore.NoStream, eventstore.EventData{Type: "Bad", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	backend, err := pjmemory.New(events, pjmemory.Config{})
	require.NoError(t, err)
	p, err := projection.New("alpha", projection.Config{}, projection.OnIdempotent("Bad",
		func(context.Context, projection.Event[json.RawMessage]) error { return errors.New("cannot") }))
	require.NoError(t, err)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: logger}, p)
	require.NoError(t, err)
	require.NoError(t, runner.Init(ctx))
	store := dlmemory.New(dlmemory.Config{})
	cfg := worker.Config{Runner: runner, Channel: ch, Logger: logger, SafetyNetInterval: -1, DisableReplayOnStart: true,
		Retry: retry.Policy{MaxAttempts: 1}, DeadLetters: store}
	w, err := worker.New(cfg)
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	select {
	case <-w.Running():
	case <-time.After(eventually):
		t.Fatal("the worker did not start")
	}

	require.NoError(t, ch.Publish(ctx, trigger.Trigger{Projection: "alpha", Reason: trigger.ReasonReplay, At: time.Now().UTC()}))
	require.Eventually(t, func() bool { return w.Stats("alpha").DeadLettered == 1 }, eventually, 10*time.Millisecond,
		"the trigger is dead-lettered")
	recs, err := store.List(ctx, deadletter.Filter{Projection: "alpha"})
	require.NoError(t, err)
	require.Len(t, recs, 1, "the dead letter is in the store")
	require.False(t, env.QueueExists(t, env.Prefix+"nudge.dead_letters"), "no dead-letter queue on the broker")
}
