package nudge_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nudgeworks/nudge"
	"github.com/nudgeworks/nudge/channel/gochannel"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
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
	<-client.Worker().Running() // the projection is registered: WaitCaughtUp can tell

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
