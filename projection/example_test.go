package projection_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

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

func ExampleRunner_CatchUpPartition() {
	ctx := context.Background()
	store, _ := memstore.New(memstore.Config{})
	backend, _ := memory.New(store, memory.Config{})

	var (
		mu    sync.Mutex
		count int
	)
	p, err := projection.New("ticket_mail", projection.Config{Partitions: 4},
		projection.OnIdempotent("TicketWasRegistered", func(_ context.Context, e projection.Event[TicketWasRegistered]) error {
			mu.Lock()
			defer mu.Unlock()
			count++ // a slow call per event would go here
			return nil
		}))
	if err != nil {
		panic(err)
	}
	runner, _ := projection.NewRunner(backend, projection.RunnerConfig{Logger: slog.New(slog.DiscardHandler)}, p)
	_ = runner.Init(ctx)
	for i := range 12 {
		data, _ := eventstore.NewEventData("TicketWasRegistered", TicketWasRegistered{ID: fmt.Sprint(i)})
		_, _ = store.Append(ctx, fmt.Sprintf("ticket-%d", i), eventstore.NoStream, data)
	}

	units, _ := runner.Partitions("ticket_mail")
	fmt.Println(units)
	var wg sync.WaitGroup
	for k := range units {
		wg.Add(1)
		go func() { // each partition on its own, as workers that own them would
			defer wg.Done()
			if _, err := runner.CatchUpPartition(ctx, "ticket_mail", k); err != nil {
				panic(err)
			}
		}()
	}
	wg.Wait()
	st, _ := runner.Status(ctx, "ticket_mail")
	fmt.Println("handled:", count, "state:", st.State, "lag:", st.LagEvents)
	for _, ps := range st.Partitions {
		fmt.Println(ps.Name, ps.EventsProcessed)
	}
	// Output:
	// [ticket_mail.p0 ticket_mail.p1 ticket_mail.p2 ticket_mail.p3]
	// handled: 12 state: running lag: 0
	// ticket_mail.p0 4
	// ticket_mail.p1 3
	// ticket_mail.p2 1
	// ticket_mail.p3 4
}
