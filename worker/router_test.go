package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
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
	require.Eventually(t, func() bool { return s.has(t, "routed", 1) }, eventually, 10*time.Millisecond)
	// The start-up catch-up may project the event before its trigger arrives: wait for it.
	require.Eventually(t, func() bool { return seen.Load() > 0 }, eventually, 10*time.Millisecond,
		"the router-level middleware saw the trigger")

	boom := errors.New("no metrics registry")
	runner, err := projection.NewRunner(s.backend, projection.RunnerConfig{Logger: s.logger}, s.model(t, "unrouted", nil))
	require.NoError(t, err)
	w, err := worker.New(worker.Config{Runner: runner, Channel: gochannel.New(gochannel.Config{}), Logger: s.logger,
		RouterFunc: func(*message.Router) error { return boom }})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), eventually)
	defer cancel()
	require.ErrorIs(t, w.Run(ctx), boom)
}

// TestRouterLogsNameTheProjection: the lines Run's router logs about a projection's handler
// carry the projection's name, like every other line about it.
func TestRouterLogsNameTheProjection(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	var buf syncBuffer
	s.logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ch := gochannel.New(gochannel.Config{})
	s.start(t, ch, worker.Config{SafetyNetInterval: -1}, s.model(t, "logged", nil))
	s.append(t, "s", storeEvent(1))
	require.Eventually(t, func() bool { return s.has(t, "logged", 1) }, eventually, 10*time.Millisecond)

	var handlerLines int
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
		if rec["handler_name"] == "nudge.logged" {
			handlerLines++
			require.Equal(t, "logged", rec["projection"], line)
		}
	}
	require.Positive(t, handlerLines, "the router logged about the handler")
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
