package retry_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/nudgeworks/nudge/retry"
)

// Wire the middleware into one handler of a router. The handler always fails with an error the
// dead letters accept: it is tried three times, then dead-lettered and acked.
func ExampleMiddleware() {
	pubsub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}

	errBadEvent := errors.New("event 7 has no customer")
	written := make(chan struct{})
	mw, err := retry.Middleware(retry.Config{
		Policy: retry.Policy{MaxAttempts: 3, InitialInterval: time.Millisecond, Jitter: -1},
		DeadLetterFunc: func(msg *message.Message, err error) error {
			// Write msg durably here; return nil only once it is stored.
			fmt.Printf("dead letter %s: %s after %s attempts (%s)\n", msg.Payload,
				msg.Metadata.Get(retry.MetadataReason), msg.Metadata.Get(retry.MetadataAttempts),
				msg.Metadata.Get(retry.MetadataStop))
			close(written)
			return nil
		},
		ShouldDeadLetterFunc: func(err error) bool {
			return retry.ShouldDeadLetterDefault(err) || errors.Is(err, errBadEvent)
		},
		OnRetryFunc: func(p retry.RetryParams) {
			fmt.Printf("%s: attempt %d failed: %v; next in %s\n", p.Handler, p.Attempt, p.Err, p.Delay)
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	router.AddConsumerHandler("orders", "triggers", pubsub, func(*message.Message) error {
		return fmt.Errorf("project orders: %w", errBadEvent)
	}).AddMiddleware(mw...)

	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	if err := pubsub.Publish("triggers", message.NewMessage(watermill.NewUUID(), []byte("trigger-1"))); err != nil {
		panic(err)
	}
	<-written
	_ = router.Close()

	// Output:
	// orders: attempt 1 failed: project orders: event 7 has no customer; next in 1ms
	// orders: attempt 2 failed: project orders: event 7 has no customer; next in 2ms
	// dead letter trigger-1: project orders: event 7 has no customer after 3 attempts (max_attempts)
}

// The waits of the default policy: the middle of each spread, and its bounds.
func ExamplePolicy_Delay() {
	p := retry.Policy{}.WithDefaults()
	for n := 1; n < p.MaxAttempts; n++ {
		fmt.Printf("before attempt %d: %v (%v to %v)\n", n+1, p.Delay(n, 0.5), p.Delay(n, 0), p.Delay(n, almostOne))
	}
	// Output:
	// before attempt 2: 200ms (160ms to 240ms)
	// before attempt 3: 400ms (320ms to 480ms)
	// before attempt 4: 800ms (640ms to 960ms)
	// before attempt 5: 1.6s (1.28s to 1.92s)
}

// Mark an error that retrying cannot fix.
func ExamplePermanent() {
	err := fmt.Errorf("decode trigger: %w", retry.Permanent(errors.New("unknown version 9")))
	fmt.Println(retry.IsPermanent(err), retry.ShouldRetryDefault(err), retry.ShouldDeadLetterDefault(err))
	fmt.Println(err)
	// Output:
	// true false true
	// decode trigger: unknown version 9
}
