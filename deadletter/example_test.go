package deadletter_test

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/deadletter/memory"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/trigger"
)

// printer is a trigger.Publisher that prints what it would publish.
type printer struct{}

func (printer) Publish(_ context.Context, t trigger.Trigger) error {
	fmt.Printf("publish: trigger for %s (%s)\n", t.Projection, t.Reason)
	return nil
}

// A projection fails on one event three times; the dead letters fold into one record, which
// an operator replays after the fix and resolves once the projection is past the event.
func Example() {
	ctx := context.Background()
	store := memory.New(memory.Config{})
	at := time.Date(2021, 3, 4, 5, 0, 0, 0, time.UTC)
	poison := &eventstore.EventRef{
		ID:       uuid.MustParse("0190d6c2-7a4e-7b8a-9c1d-2e3f4a5b6c7d"),
		Type:     "TicketWasRegistered",
		StreamID: "ticket-42",
		Position: eventstore.Position{TransactionID: 7414, GlobalPosition: 1203},
	}
	for i := range 3 {
		_, err := store.Add(ctx, deadletter.Entry{
			Projection:   "tickets",
			MessageUUID:  fmt.Sprintf("msg-%d", i),
			Payload:      []byte(`{"v":1,"reason":"append"}`),
			Error:        "price must not be negative",
			FailingEvent: poison,
			Attempts:     5,
			At:           at.Add(time.Duration(i) * time.Minute),
		})
		if err != nil {
			panic(err)
		}
	}

	open, err := store.List(ctx, deadletter.Filter{Status: []deadletter.Status{deadletter.StatusFailed}})
	if err != nil {
		panic(err)
	}
	for _, r := range open {
		fmt.Printf("record %d: %s on %s at %s: %d deliveries, %d attempts: %s\n",
			r.ID, r.Projection, r.FailingEvent.Type, r.FailingEvent.Position, r.Count, r.Attempts, r.Error)
	}

	res, err := deadletter.Replay(ctx, store, printer{}, deadletter.ReplayFilter{Projection: "tickets"}, "ann", at.Add(time.Hour))
	if err != nil {
		panic(err)
	}
	fmt.Printf("replayed %d record(s) of %v\n", res.Replayed, res.Projections)

	if err := store.Resolve(ctx, open[0].ID, "ann", "fixed the price validation", at.Add(2*time.Hour)); err != nil {
		panic(err)
	}
	r, err := store.Get(ctx, open[0].ID)
	if err != nil {
		panic(err)
	}
	fmt.Printf("record %d: %s by %s: %s\n", r.ID, r.Status, r.ResolvedBy, r.ResolveNote)
	// Output:
	// record 1: tickets on TicketWasRegistered at 7414/1203: 3 deliveries, 15 attempts: price must not be negative
	// publish: trigger for tickets (replay)
	// replayed 1 record(s) of [tickets]
	// record 1: resolved by ann: fixed the price validation
}
