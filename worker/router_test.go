package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
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
	ch, err := gochannel.New(gochannel.Config{})
	require.NoError(t, err)
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
	w, err := worker.New(worker.Config{Runner: runner, Channel: goChannel(t), Logger: s.logger,
		DeadLetters: s.dead, RouterFunc: func(*message.Router) error { return boom }})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), eventually)
	defer cancel()
	require.ErrorIs(t, w.Run(ctx), boom)
}

// TestRouterLogsNameTheProjection: the lines the router logs about a projection's handler, and
// the lines the channel's subscriber logs about its subscription (watermill-amqp's among them),
// carry the projection's name like every other line about it — with Run's router and with a
// router of the service's own that uses worker.RouterLogger.
func TestRouterLogsNameTheProjection(t *testing.T) {
	t.Parallel()
	for _, channelName := range []string{"gochannel", "amqp"} {
		for _, own := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/own-router=%t", channelName, own), func(t *testing.T) {
				t.Parallel()
				routerLogsNameTheProjection(t, channelName, own)
			})
		}
	}
}

func routerLogsNameTheProjection(t *testing.T, channelName string, own bool) {
	s := newSetup(t)
	var buf syncBuffer
	s.logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s.ownRouter = own
	var ch channel.Channel = goChannel(t)
	if channelName != "gochannel" {
		ch = s.newChannel(t, channels[channelName])
	}
	s.start(t, ch, worker.Config{SafetyNetInterval: -1}, s.model(t, "logged", nil))
	s.append(t, "s", storeEvent(1))
	require.Eventually(t, func() bool { return s.has(t, "logged", 1) }, eventually, 10*time.Millisecond)
	_, topic, err := ch.Subscriber("logged")
	require.NoError(t, err)

	var handlerLines, subscriberLines int
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
		if rec["handler_name"] == worker.HandlerPrefix+"logged" {
			handlerLines++
			require.Equal(t, "logged", rec["projection"], line)
		}
		if rec["topic"] == topic || (rec["amqp_queue_name"] != nil && strings.HasSuffix(fmt.Sprint(rec["amqp_queue_name"]), "logged")) {
			subscriberLines++
			require.Equal(t, "logged", rec["projection"], line)
		}
	}
	require.Positive(t, handlerLines, "the router logged about the handler")
	if channelName == "amqp" {
		require.Positive(t, subscriberLines, "the subscriber logged about its queue")
	}
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
