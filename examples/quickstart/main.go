// Quickstart shows nudge healing a projection, with no servers: the in-memory event store,
// projection backend and dead-letter store, and Watermill's GoChannel.
//
// A ticket_list projection accepts ticket types of at most 25 characters (think VARCHAR(25)).
// A ticket with a 30-character type makes it fail: the trigger is retried, then dead-lettered,
// naming the event. A second projection, ticket_stats, keeps going meanwhile. After the "fix"
// (the limit is raised) a replay makes ticket_list read on from where it stopped: every event
// handled, none skipped, no reset.
//
// Run it with `make demo` or `go run ./examples/quickstart`.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nudgeworks/nudge"
	"github.com/nudgeworks/nudge/channel/gochannel"
	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/retry"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// TicketWasRegistered and TicketWasClosed are the demo's events.
type TicketWasRegistered struct {
	ID   string `json:"id"`
	Type string `json:"type"`
}

type TicketWasClosed struct {
	ID string `json:"id"`
}

// readModels are the two projections' in-memory read models.
type readModels struct {
	mu      sync.Mutex
	tickets map[string]string // ticket id → status
	stats   map[string]int    // "registered" / "closed" → count
	maxType atomic.Int64      // ticket_list's column width; the "fix" raises it
	handled map[string]int    // ticket_list: events handled per event id, to show exactly once
}

func (m *readModels) projections() (list, stats *projection.Projection, err error) {
	list, err = projection.New("ticket_list", projection.Config{},
		projection.OnIdempotent("TicketWasRegistered", func(_ context.Context, e projection.Event[TicketWasRegistered]) error {
			if int64(len(e.Data.Type)) > m.maxType.Load() {
				return fmt.Errorf("value too long for type character varying(%d): %q", m.maxType.Load(), e.Data.Type)
			}
			m.mu.Lock()
			defer m.mu.Unlock()
			m.tickets[e.Data.ID] = "open"
			m.handled[e.ID.String()]++
			return nil
		}),
		projection.OnIdempotent("TicketWasClosed", func(_ context.Context, e projection.Event[TicketWasClosed]) error {
			m.mu.Lock()
			defer m.mu.Unlock()
			m.tickets[e.Data.ID] = "closed"
			m.handled[e.ID.String()]++
			return nil
		}))
	if err != nil {
		return nil, nil, err
	}
	count := func(kind string) func(context.Context, eventstore.Event) error {
		return func(context.Context, eventstore.Event) error {
			m.mu.Lock()
			defer m.mu.Unlock()
			m.stats[kind]++
			return nil
		}
	}
	stats, err = projection.New("ticket_stats", projection.Config{},
		projection.OnIdempotent("TicketWasRegistered", func(ctx context.Context, e projection.Event[TicketWasRegistered]) error {
			return count("registered")(ctx, e.Event)
		}),
		projection.OnIdempotent("TicketWasClosed", func(ctx context.Context, e projection.Event[TicketWasClosed]) error {
			return count("closed")(ctx, e.Event)
		}))
	return list, stats, err
}

func (m *readModels) snapshot() (tickets, closed, registeredStat, closedStat int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, st := range m.tickets {
		if st == "closed" {
			closed++
		}
	}
	return len(m.tickets), closed, m.stats["registered"], m.stats["closed"]
}

func run(ctx context.Context, out io.Writer) (err error) {
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	logger := slog.New(slog.DiscardHandler) // the narration below tells the story

	models := &readModels{tickets: map[string]string{}, stats: map[string]int{}, handled: map[string]int{}}
	models.maxType.Store(25)
	list, stats, err := models.projections()
	if err != nil {
		return err
	}
	ch, err := gochannel.New(gochannel.Config{})
	if err != nil {
		return err
	}
	defer ch.Close()
	client, err := nudge.NewInMemory(nudge.Config{ // on PostgreSQL: nudge.New(pool, …), the same Config
		Channel: ch, Projections: []*projection.Projection{list, stats}, Logger: logger,
		Retry: retry.Policy{MaxAttempts: 3, InitialInterval: 50 * time.Millisecond, MaxInterval: 100 * time.Millisecond},
	})
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- client.Run(runCtx) }()
	defer func() {
		stop()
		err = errors.Join(err, <-done)
	}()
	select {
	case <-client.Worker().Running():
	case err := <-done:
		return err
	}
	runner, dead := client.Runner(), client.DeadLetters()

	appendEvent := func(stream, typ string, v any) error {
		data, err := eventstore.NewEventData(typ, v)
		if err != nil {
			return err
		}
		_, err = client.Append(ctx, stream, eventstore.Any, data)
		return err
	}
	register := func(id, typ string) error {
		return appendEvent("ticket-"+id, "TicketWasRegistered", TicketWasRegistered{ID: id, Type: typ})
	}
	waitFor := func(what string, cond func() bool) error {
		for !cond() {
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
			case <-time.After(10 * time.Millisecond):
			}
		}
		return nil
	}

	say("1. Registering tickets 1–3. Each append publishes a trigger; each projection catches up from its own position.")
	for _, id := range []string{"1", "2", "3"} {
		if err := register(id, "bug"); err != nil {
			return err
		}
	}
	if err := waitFor("three tickets", func() bool { t, _, r, _ := models.snapshot(); return t == 3 && r == 3 }); err != nil {
		return err
	}
	tickets, _, registered, _ := models.snapshot()
	say("   ticket_list has %d tickets, ticket_stats counted %d registrations.", tickets, registered)

	long := strings.Repeat("x", 30)
	say("2. Registering ticket 4 with a %d-character type; ticket_list only takes 25.", len(long))
	if err := register("4", long); err != nil {
		return err
	}
	var rec deadletter.Record
	if err := waitFor("the dead letter", func() bool {
		recs, err := dead.List(ctx, deadletter.Filter{Projection: "ticket_list"})
		if err != nil || len(recs) == 0 {
			return false
		}
		rec = recs[0]
		return true
	}); err != nil {
		return err
	}
	say("   ticket_list failed; its trigger was tried %d times, then dead-lettered:", rec.Attempts)
	say("   dead letter %d: event %s at position %s", rec.ID, rec.FailingEvent.Type, rec.FailingEvent.Position)
	say("   error: %s", rec.Error)
	st, err := runner.Status(ctx, "ticket_list")
	if err != nil {
		return err
	}
	say("   ticket_list is %s; its position stays right before the failing event.", st.State)

	say("3. Meanwhile: tickets 5 and 6 are registered and ticket 1 is closed.")
	for _, id := range []string{"5", "6"} {
		if err := register(id, "question"); err != nil {
			return err
		}
	}
	if err := appendEvent("ticket-1", "TicketWasClosed", TicketWasClosed{ID: "1"}); err != nil {
		return err
	}
	if err := waitFor("ticket_stats", func() bool { _, _, r, c := models.snapshot(); return r == 6 && c == 1 }); err != nil {
		return err
	}
	tickets, _, registered, closedStat := models.snapshot()
	say("   ticket_stats kept going: %d registered, %d closed. ticket_list still shows %d tickets: it waits, it does not skip.",
		registered, closedStat, tickets)

	say("4. Deploying the fix: ticket_list now takes types of up to 100 characters.")
	models.maxType.Store(100)

	say("5. Replaying the dead letter (what `nudge deadletter replay --projection ticket_list` does).")
	if _, err := deadletter.Replay(ctx, dead, ch, deadletter.ReplayFilter{Projection: "ticket_list"}, "quickstart", time.Now()); err != nil {
		return err
	}
	if err := runner.WaitCaughtUp(ctx, "ticket_list"); err != nil {
		return err
	}
	if st, err = runner.Status(ctx, "ticket_list"); err != nil {
		return err
	}
	tickets, closed, _, _ := models.snapshot()
	if tickets != 6 || closed != 1 {
		return fmt.Errorf("ticket_list caught up with %d tickets and %d closed, want 6 and 1", tickets, closed)
	}
	say("   ticket_list is %s: %d tickets, %d closed, lag %d events.", st.Condition(), tickets, closed, st.LagEvents)
	models.mu.Lock()
	for id, n := range models.handled {
		if n != 1 {
			models.mu.Unlock()
			return errors.New("event " + id + " was handled more than once")
		}
	}
	handled := len(models.handled)
	models.mu.Unlock()
	say("   Every one of its %d events was handled once; none was skipped; nothing was reset.", handled)
	return nil
}
