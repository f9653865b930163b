package worker_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel/gochannel"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/worker"
)

// TestRouterFunc: Run hands its router to RouterFunc before running it, so router-level
// middleware sees the triggers; a RouterFunc error stops Run before anything is consumed.
func TestRouterFunc(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	var seen atomic.Int64
	ch := gochannel.New(gochannel.Config{})
	s.start(t, ch, worker.Config{SafetyNetInterval: -1, RouterFunc: func(r *message.Router) error {
		r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				seen.Add(1)
				return h(msg)
			}
		})
		return nil
	}}, s.model(t, "routed", nil))
	s.append(t, "s", storeEvent(1))
	require.Eventually(t, func() bool { return s.has(t, "routed", 1) }, 30*time.Second, 10*time.Millisecond)
	require.Positive(t, seen.Load(), "the router-level middleware saw the trigger")

	boom := errors.New("no metrics registry")
	runner, err := projection.NewRunner(s.backend, projection.RunnerConfig{Logger: s.logger}, s.model(t, "unrouted", nil))
	require.NoError(t, err)
	w, err := worker.New(worker.Config{Runner: runner, Channel: gochannel.New(gochannel.Config{}), Logger: s.logger,
		RouterFunc: func(*message.Router) error { return boom }})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.ErrorIs(t, w.Run(ctx), boom)
}
