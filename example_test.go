package nudge_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/nudgeworks/nudge"
	"github.com/nudgeworks/nudge/channel/gochannel"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/worker"
)

type TicketWasRegistered struct {
	ID string `json:"id"`
}

// A client in memory: one projection, triggers through GoChannel, Run on a goroutine. On
// PostgreSQL, nudge.New(pool, cfg) takes the same Config.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu      sync.Mutex
		tickets []string
	)
	list, _ := projection.New("ticket_list", projection.Config{},
		projection.OnIdempotent("TicketWasRegistered", func(_ context.Context, e projection.Event[TicketWasRegistered]) error {
			mu.Lock()
			defer mu.Unlock()
			tickets = append(tickets, e.Data.ID)
			return nil
		}))
	ch, _ := gochannel.New(gochannel.Config{})
	defer ch.Close()
	client, err := nudge.NewInMemory(nudge.Config{Channel: ch, Projections: []*projection.Projection{list},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = client.Migrate(ctx)
	done := make(chan error)
	go func() { done <- client.Run(ctx) }()
	<-client.Running() // the projection is registered: WaitCaughtUp can tell

	for _, id := range []string{"t-1", "t-2", "t-3"} {
		data, _ := eventstore.NewEventData("TicketWasRegistered", TicketWasRegistered{ID: id})
		_, _ = client.Append(ctx, "ticket-"+id, eventstore.NoStream, data)
	}
	waitCtx, stopWaiting := context.WithTimeout(ctx, time.Minute)
	_ = client.WaitCaughtUp(waitCtx, "ticket_list")
	stopWaiting()
	mu.Lock()
	fmt.Println("ticket_list:", tickets)
	mu.Unlock()
	st, _ := client.Status(ctx, "ticket_list")
	fmt.Println("condition:", st.Condition())

	cancel()
	fmt.Println("run:", <-done)
	// Output:
	// ticket_list: [t-1 t-2 t-3]
	// condition: caught_up
	// run: <nil>
}

// Handlers on a Watermill router of the service's own: AddHandlers adds one per projection,
// RunRouter runs the router and the rest of the client (the relay, the replay after deploy,
// the safety net) until ctx ends — or until either stops, which then stops the other and
// returns why. Running is closed once the handlers are subscribed: the service is ready.
func ExampleClient_RunRouter() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	list, _ := projection.New("ticket_list", projection.Config{},
		projection.OnIdempotent("TicketWasRegistered", func(_ context.Context, e projection.Event[TicketWasRegistered]) error {
			fmt.Println("projected", e.Data.ID)
			return nil
		}))
	ch, _ := gochannel.New(gochannel.Config{})
	defer ch.Close()
	logger := slog.New(slog.DiscardHandler)
	client, _ := nudge.NewInMemory(nudge.Config{Channel: ch, Projections: []*projection.Projection{list}, Logger: logger})
	router, _ := message.NewRouter(message.RouterConfig{}, worker.RouterLogger(watermill.NewSlogLogger(logger)))
	// router.AddConsumerHandler(…) for the service's own handlers.
	if err := client.AddHandlers(ctx, router); err != nil {
		fmt.Println(err)
		return
	}
	done := make(chan error, 1)
	go func() { done <- client.RunRouter(ctx, router) }() // return its error from main: the process stops with it
	<-client.Running()

	data, _ := eventstore.NewEventData("TicketWasRegistered", TicketWasRegistered{ID: "t-1"})
	_, _ = client.Append(ctx, "ticket-t-1", eventstore.NoStream, data)
	waitCtx, stopWaiting := context.WithTimeout(ctx, time.Minute)
	_ = client.WaitCaughtUp(waitCtx, "ticket_list")
	stopWaiting()

	cancel()
	fmt.Println("run:", <-done)
	// Output:
	// projected t-1
	// run: <nil>
}

// A process that only appends, reads and reports status while other processes run the
// projections (an API) needs no channel: it opens no broker connection, and Run would return
// ErrNoChannel. On PostgreSQL, nudge.New(pool, cfg) takes the same Config; call Migrate and
// Prepare at start.
func Example_appendOnly() {
	ctx := context.Background()
	list, _ := projection.New("ticket_list", projection.Config{},
		projection.OnIdempotent("TicketWasRegistered", func(context.Context, projection.Event[TicketWasRegistered]) error { return nil }))
	client, err := nudge.NewInMemory(nudge.Config{Projections: []*projection.Projection{list}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Println(err)
		return
	}
	data, _ := eventstore.NewEventData("TicketWasRegistered", TicketWasRegistered{ID: "t-1"})
	res, err := client.Append(ctx, "ticket-t-1", eventstore.NoStream, data)
	fmt.Println("stream version:", res.StreamVersion, err)
	fmt.Println("run:", errors.Is(client.Run(ctx), nudge.ErrNoChannel))
	// Output:
	// stream version: 1 <nil>
	// run: true
}
