package retry_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/retry"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	topic       = "nudge.triggers"
	handlerName = "nudge.orders"
)

// waitFor bounds every wait on a signal in these tests, and the router's CloseTimeout: an upper
// bound for a failure on a busy machine; the waits take milliseconds.
var waitFor = testwait.For(time.Minute)

// routerHarness is a Watermill router on a GoChannel, with the retry middleware on its one
// handler. The handler's behaviour depends on the payload: "fail" returns errPoison, "panic"
// panics, anything else succeeds.
type routerHarness struct {
	pubsub *gochannel.GoChannel
	router *message.Router
	ran    chan error

	mu          sync.Mutex
	calls       map[string]int
	retries     []retry.RetryParams
	deadLetters []*message.Message

	deadLettered chan string // payloads, once each is written
	handled      chan string // payloads handled successfully
	retrying     chan struct{}
}

func startRouter(t *testing.T, cfg retry.Config) *routerHarness {
	t.Helper()
	r := &routerHarness{
		pubsub:       gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{}),
		ran:          make(chan error, 1),
		calls:        map[string]int{},
		deadLettered: make(chan string, 10),
		handled:      make(chan string, 10),
		retrying:     make(chan struct{}, 100),
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: waitFor}, watermill.NopLogger{})
	require.NoError(t, err)
	r.router = router

	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.ShouldDeadLetterFunc = func(err error) bool { return retry.ShouldDeadLetterDefault(err) || errors.Is(err, errPoison) }
	cfg.DeadLetterFunc = func(msg *message.Message, _ error) error {
		r.mu.Lock()
		r.deadLetters = append(r.deadLetters, msg)
		r.mu.Unlock()
		r.deadLettered <- string(msg.Payload)
		return nil
	}
	cfg.OnRetryFunc = func(p retry.RetryParams) {
		r.mu.Lock()
		r.retries = append(r.retries, p)
		r.mu.Unlock()
		r.retrying <- struct{}{}
	}
	mw, err := retry.Middleware(cfg)
	require.NoError(t, err)
	router.AddConsumerHandler(handlerName, topic, r.pubsub, func(msg *message.Message) error {
		payload := string(msg.Payload)
		r.mu.Lock()
		r.calls[payload]++
		r.mu.Unlock()
		switch payload {
		case "fail":
			return errPoison
		case "panic":
			panic("projection orders: index out of range")
		}
		r.handled <- payload
		return nil
	}).AddMiddleware(mw...)

	go func() { r.ran <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case <-time.After(waitFor):
		t.Fatal("the router did not start")
	}
	t.Cleanup(func() { r.close(t) })
	return r
}

func (r *routerHarness) publish(t *testing.T, payload string) {
	t.Helper()
	require.NoError(t, r.pubsub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(payload))))
}

// close stops the router and waits for Run to return; it fails the test if Close timed out,
// which is what a backoff that ignores the message's context would cause.
func (r *routerHarness) close(t *testing.T) {
	t.Helper()
	if r.router.IsClosed() {
		return
	}
	require.NoError(t, r.router.Close())
	select {
	case err := <-r.ran:
		require.NoError(t, err)
	case <-time.After(waitFor):
		t.Fatal("the router's Run did not return")
	}
}

func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitFor):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func TestRouterDeadLettersOnceAndKeepsConsuming(t *testing.T) {
	t.Parallel()
	r := startRouter(t, retry.Config{
		// Real waits of 1 and 2 ms.
		Policy: retry.Policy{MaxAttempts: 3, InitialInterval: time.Millisecond, Jitter: -1},
	})

	r.publish(t, "fail")
	require.Equal(t, "fail", receive(t, r.deadLettered, "the failing message's dead letter"))
	r.publish(t, "panic")
	require.Equal(t, "panic", receive(t, r.deadLettered, "the panicking message's dead letter"))
	r.publish(t, "next")
	require.Equal(t, "next", receive(t, r.handled, "the next message"))
	r.close(t) // nothing can be redelivered or dead-lettered any more

	r.mu.Lock()
	defer r.mu.Unlock()
	require.Equal(t, map[string]int{"fail": 3, "panic": 3, "next": 1}, r.calls)
	require.Len(t, r.deadLetters, 2, "each dead-lettered exactly once")
	for _, dl := range r.deadLetters {
		require.Equal(t, "3", dl.Metadata.Get(retry.MetadataAttempts))
		require.Equal(t, "max_attempts", dl.Metadata.Get(retry.MetadataStop))
		require.Equal(t, handlerName, message.HandlerNameFromCtx(dl.Context()))
	}
	require.Equal(t, "handler cannot project event 7", r.deadLetters[0].Metadata.Get(retry.MetadataReason))
	require.Equal(t, "retry: handler panicked: projection orders: index out of range", r.deadLetters[1].Metadata.Get(retry.MetadataReason))
	require.Len(t, r.retries, 4)
	for _, p := range r.retries {
		require.Equal(t, handlerName, p.Handler)
	}
	require.Equal(t, []time.Duration{time.Millisecond, 2 * time.Millisecond}, []time.Duration{r.retries[0].Delay, r.retries[1].Delay})
}

func TestRouterShutdownDuringBackoffDeadLettersNothing(t *testing.T) {
	t.Parallel()
	r := startRouter(t, retry.Config{
		// The first wait is an hour: only the shutdown can end it.
		Policy: retry.Policy{InitialInterval: time.Hour, MaxElapsedTime: -1},
	})

	r.publish(t, "fail")
	receive(t, r.retrying, "the first backoff")
	r.close(t) // fails if Close times out (CloseTimeout, far below the hour) waiting for the handler

	r.mu.Lock()
	defer r.mu.Unlock()
	require.Empty(t, r.deadLetters, "a shutdown is not a failure")
	require.Positive(t, r.calls["fail"])
	require.Len(t, r.retries, 1)
}
