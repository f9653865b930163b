package projection_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nudgeworks/nudge/eventstore"
	memstore "github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/memory"
)

type TicketWasRegistered struct {
	ID string `json:"id"`
}

func ExampleRunner_CatchUp() {
	ctx := context.Background()
	store, _ := memstore.New(memstore.Config{})
	backend, _ := memory.New(store, memory.Config{})

	var tickets []string
	p, err := projection.New("ticket_list", projection.Config{BatchSize: 2},
		projection.OnIdempotent("TicketWasRegistered", func(_ context.Context, e projection.Event[TicketWasRegistered]) error {
			tickets = append(tickets, e.Data.ID)
			return nil
		}))
	if err != nil {
		panic(err)
	}
	runner, _ := projection.NewRunner(backend, projection.RunnerConfig{Logger: slog.New(slog.DiscardHandler)}, p)
	_ = runner.Init(ctx)

	for _, id := range []string{"t-1", "t-2", "t-3"} {
		data, _ := eventstore.NewEventData("TicketWasRegistered", TicketWasRegistered{ID: id})
		_, _ = store.Append(ctx, "ticket-"+id, eventstore.NoStream, data)
	}
	res, err := runner.CatchUp(ctx, "ticket_list")
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Events, "events in", res.Batches, "batches:", tickets)
	st, _ := runner.Status(ctx, "ticket_list")
	fmt.Println("state:", st.State, "lag:", st.LagEvents)
	// Output:
	// 3 events in 2 batches: [t-1 t-2 t-3]
	// state: running lag: 0
}
