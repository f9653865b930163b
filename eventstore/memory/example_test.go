package memory_test

import (
	"context"
	"fmt"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/memory"
)

func ExampleStore_Append() {
	ctx := context.Background()
	store, _ := memory.New(memory.Config{})

	registered, _ := eventstore.NewEventData("TicketWasRegistered", map[string]string{"id": "t-1"})
	closed, _ := eventstore.NewEventData("TicketWasClosed", map[string]string{"id": "t-1"})
	res, err := store.Append(ctx, "ticket-t-1", eventstore.NoStream, registered, closed)
	if err != nil {
		panic(err)
	}
	fmt.Println("stream version:", res.StreamVersion)

	_, err = store.Append(ctx, "ticket-t-1", eventstore.NoStream, closed)
	fmt.Println("append to an existing stream with NoStream:", err)

	events, _ := store.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{Types: []string{"TicketWasClosed"}})
	for _, e := range events {
		fmt.Println(e.StreamID, e.StreamVersion, e.Type, string(e.Payload))
	}
	// Output:
	// stream version: 2
	// append to an existing stream with NoStream: eventstore: stream "ticket-t-1" is at version 2, the append expected no stream; reload the stream and decide again
	// ticket-t-1 2 TicketWasClosed {"id":"t-1"}
}
