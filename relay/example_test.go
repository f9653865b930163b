package relay_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nudgeworks/nudge/eventstore"
	esmemory "github.com/nudgeworks/nudge/eventstore/memory"
	pjmemory "github.com/nudgeworks/nudge/projection/memory"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/trigger"
)

// publisherFunc is a trigger.Publisher; a channel.Channel is the usual one.
type publisherFunc func(ctx context.Context, t trigger.Trigger) error

func (f publisherFunc) Publish(ctx context.Context, t trigger.Trigger) error { return f(ctx, t) }

// The relay tails the store from a position of its own and publishes one trigger for the
// events it finds, however many there are.
func ExampleNew() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store, _ := esmemory.New(esmemory.Config{})
	backend, _ := pjmemory.New(store, pjmemory.Config{})

	registered, _ := eventstore.NewEventData("TicketWasRegistered", map[string]string{"id": "t-1"})
	closed, _ := eventstore.NewEventData("TicketWasClosed", map[string]string{"id": "t-1"})
	res, _ := store.Append(ctx, "ticket-t-1", eventstore.NoStream, registered, closed)

	published := make(chan trigger.Trigger, 1)
	pub := publisherFunc(func(_ context.Context, t trigger.Trigger) error {
		published <- t
		return nil
	})
	r, err := relay.New(backend, pub, relay.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()

	t := <-published
	fmt.Println(t.Reason, t.StreamID, t.Types, t.Position == res.Last())
	cancel()
	fmt.Println("relay stopped:", <-done)
	// Output:
	// append ticket-t-1 [TicketWasClosed TicketWasRegistered] true
	// relay stopped: <nil>
}
