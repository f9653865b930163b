package worker_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/nudgeworks/nudge/channel/gochannel"
	dlmemory "github.com/nudgeworks/nudge/deadletter/memory"
	"github.com/nudgeworks/nudge/eventstore"
	esmemory "github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/projection"
	pjmemory "github.com/nudgeworks/nudge/projection/memory"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/worker"
)

type TicketWasRegistered struct {
	ID string `json:"id"`
}

// The worker's handlers on a Watermill router you own: one handler per projection, each with
// its own subscription, retries and dead letters. A relay.Relay publishes a trigger for every
// batch of appended events; the handler reads the store from the projection's own position.
func ExampleWorker_AddHandlers() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	quiet := slog.New(slog.DiscardHandler)
	store, _ := esmemory.New(esmemory.Config{})
	backend, _ := pjmemory.New(store, pjmemory.Config{})

	var (
		mu      sync.Mutex
		tickets []string
	)
	ticketList, _ := projection.New("ticket_list", projection.Config{},
		projection.OnIdempotent("TicketWasRegistered", func(_ context.Context, e projection.Event[TicketWasRegistered]) error {
			mu.Lock()
			defer mu.Unlock()
			tickets = append(tickets, e.Data.ID)
			return nil
		}))
	runner, _ := projection.NewRunner(backend, projection.RunnerConfig{Logger: quiet}, ticketList)

	ch, _ := gochannel.New(gochannel.Config{}) // or channel/amqp, channel/postgres
	dead := dlmemory.New(dlmemory.Config{})    // or deadletter/postgres, which `nudge deadletter` sees
	w, _ := worker.New(worker.Config{Runner: runner, Channel: ch, DeadLetters: dead, Logger: quiet})
	// worker.RouterLogger: the router's lines about a projection's handler name the projection.
	router, _ := message.NewRouter(message.RouterConfig{}, worker.RouterLogger(watermill.NewSlogLogger(quiet)))
	_ = w.Prepare(ctx) // status rows, init hooks; subscriptions exist before the first append
	_ = w.AddHandlers(router)
	relay, _ := relay.New(backend, ch, relay.Config{Logger: quiet})

	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); _ = router.Run(ctx) }()
	go func() { defer wg.Done(); _ = relay.Run(ctx) }()
	// Once the router runs: replay dead letters (replay after deploy), catch up, safety net.
	go func() { defer wg.Done(); _ = w.RunBackground(ctx) }()
	<-router.Running()

	for _, id := range []string{"t-1", "t-2", "t-3"} {
		data, _ := eventstore.NewEventData("TicketWasRegistered", TicketWasRegistered{ID: id})
		_, _ = store.Append(ctx, "ticket-"+id, eventstore.NoStream, data)
	}
	waitCtx, stopWaiting := context.WithTimeout(ctx, time.Minute)
	_ = runner.WaitCaughtUp(waitCtx, "ticket_list")
	stopWaiting()
	mu.Lock()
	fmt.Println("ticket_list:", tickets)
	mu.Unlock()
	st, _ := runner.Status(ctx, "ticket_list")
	fmt.Println("state:", st.State, "lag:", st.LagEvents)

	cancel()
	wg.Wait()
	_ = ch.Close()
	// Output:
	// ticket_list: [t-1 t-2 t-3]
	// state: running lag: 0
}
