package nudgetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nudgeworks/nudge"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/backoff"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
)

// WaitDefault bounds RunToHead's wait for a projection to reach the head (scaled by
// NUDGE_TEST_TIMEOUT_SCALE, if set): an upper bound for a busy machine, not the expected time.
const WaitDefault = 2 * time.Minute

// Kit runs a test's projections on its database without a broker: it appends events, catches
// the projections up and asserts on what they did. Its methods take the test (or subtest)
// they report to.
type Kit struct {
	// DB is the kit's database; nil for a kit of NewInMemory.
	DB *DB
	// Client is the nudge client the kit appends and catches up with; it has no channel and is
	// never Run.
	Client *nudge.Client
}

// New returns a kit for projections on db. cfg is the service's configuration: its
// Projections, Schema (default db.Schema) and Limits count; Channel must be nil (the kit
// needs no broker), and Logger defaults to one that discards. New prepares the projections
// (their init hooks create their tables).
func New(t testing.TB, db *DB, cfg nudge.Config) *Kit {
	t.Helper()
	if db == nil {
		t.Fatalf("nudgetest: New needs a database: pass nudgetest.Database(t, …)")
	}
	if cfg.Channel != nil {
		t.Fatalf("nudgetest: New runs projections without a broker: leave Config.Channel nil")
	}
	if cfg.Schema == "" {
		cfg.Schema = db.Schema
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	client, err := nudge.New(db.Pool, cfg)
	if err != nil {
		t.Fatalf("nudgetest: %v", err)
	}
	ctx, cancel := waitContext()
	defer cancel()
	if err := client.Migrate(ctx); err != nil {
		t.Fatalf("nudgetest: migrate: %v", err)
	}
	if err := client.Prepare(ctx); err != nil {
		t.Fatalf("nudgetest: prepare the projections: %v", err)
	}
	return &Kit{DB: db, Client: client}
}

// NewInMemory returns a kit for projections on nudge's in-memory event store and projection
// backend (nudge.NewInMemory), for projections whose read models are not in PostgreSQL: it
// needs no server. Rows and RequireRows are not available: assert on the read model
// directly.
func NewInMemory(t testing.TB, cfg nudge.Config) *Kit {
	t.Helper()
	if cfg.Channel != nil {
		t.Fatalf("nudgetest: NewInMemory runs projections without a broker: leave Config.Channel nil")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	client, err := nudge.NewInMemory(cfg)
	if err != nil {
		t.Fatalf("nudgetest: %v", err)
	}
	ctx, cancel := waitContext()
	defer cancel()
	if err := client.Prepare(ctx); err != nil {
		t.Fatalf("nudgetest: prepare the projections: %v", err)
	}
	return &Kit{Client: client}
}

func waitContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), testwait.For(WaitDefault))
}

// Event returns the event data of an event of type eventType with v as its JSON payload,
// failing t if v does not encode.
func Event(t testing.TB, eventType string, v any) eventstore.EventData {
	t.Helper()
	data, err := eventstore.NewEventData(eventType, v)
	if err != nil {
		t.Fatalf("nudgetest: event %s: %v", eventType, err)
	}
	return data
}

// Append appends events to stream, whatever its version, and returns what was appended; it
// fails t if the append fails.
func (k *Kit) Append(t testing.TB, stream string, events ...eventstore.EventData) eventstore.AppendResult {
	t.Helper()
	ctx, cancel := waitContext()
	defer cancel()
	res, err := k.Client.Append(ctx, stream, eventstore.Any, events...)
	if err != nil {
		t.Fatalf("nudgetest: append %d events to %s: %v", len(events), stream, err)
	}
	return res
}

// RunToHead catches the named projections (every projection of the kit when none is named)
// up to the newest event: it runs their batches until each is caught up, waiting while an
// open transaction elsewhere on the server holds the event store's horizon. It fails t when a
// projection fails (naming the event and the error) or is not caught up in WaitDefault. A
// stream parked by a projection with projection.OnFailurePark does not fail it.
func (k *Kit) RunToHead(t testing.TB, names ...string) {
	t.Helper()
	if err := k.CatchUp(t, names...); err != nil {
		t.Fatalf("nudgetest: RunToHead: %v", err)
	}
}

// CatchUp is RunToHead for a test that expects a failure: it returns the projections' errors
// (a *projection.HandlerError for a handler that failed) instead of failing t. It fails t
// only when it cannot tell, or when a projection does not come to rest in WaitDefault.
func (k *Kit) CatchUp(t testing.TB, names ...string) error {
	t.Helper()
	if len(names) == 0 {
		names = k.Client.Runner().Names()
	}
	ctx, cancel := waitContext()
	defer cancel()
	runner := k.Client.Runner()
	wait := backoff.Exponential{Initial: time.Millisecond, Max: 100 * time.Millisecond}
	for {
		var errs []error
		pending := make([]string, 0, len(names))
		for _, name := range names {
			if _, err := runner.CatchUp(ctx, name); err != nil {
				if ctx.Err() != nil {
					t.Fatalf("nudgetest: %s not at the head after %s: %v", name, testwait.For(WaitDefault), err)
					return nil
				}
				errs = append(errs, err) // it names the projection
				continue
			}
			st, err := runner.Status(ctx, name)
			if err != nil {
				errs = append(errs, fmt.Errorf("projection %s: status: %w", name, err))
				continue
			}
			switch c := st.Condition(); c {
			case projection.ConditionCaughtUp, projection.ConditionRetired:
			case projection.ConditionPaused, projection.ConditionFailing:
				errs = append(errs, fmt.Errorf("projection %s is %s at position %s%s", name, c, st.Position, lastError(st)))
			default:
				pending = append(pending, fmt.Sprintf("%s is %s (position %s, lag %d)", name, c, st.Position, st.LagEvents))
			}
		}
		if len(errs) > 0 || len(pending) == 0 {
			return errors.Join(errs...)
		}
		if err := backoff.Sleep(ctx, wait.Next()); err != nil {
			t.Fatalf("nudgetest: not at the head after %s: %s", testwait.For(WaitDefault), strings.Join(pending, "; "))
			return nil
		}
	}
}

// lastError is ": " and st's last error, or nothing when it has none.
func lastError(st projection.Status) string {
	if st.LastError == "" {
		return ""
	}
	return ": " + st.LastError
}
