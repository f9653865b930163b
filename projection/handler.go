package projection

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/eventstore"
)

// Event is an event whose payload has been decoded into T for a typed handler.
type Event[T any] struct {
	eventstore.Event
	// Data is the decoded payload.
	Data T
	// Replay is true when the event is history handled again by a version being built beside
	// the active one (see Replaying): skip side effects outside the read model.
	Replay bool
}

// Handler handles the events of one type for a projection. Make one with On or OnQueued (a
// PostgreSQL read model, exactly-once) or OnIdempotent (any other read model, at-least-once).
type Handler struct {
	eventType     string
	transactional bool
	handle        func(ctx context.Context, tx pgx.Tx, e eventstore.Event) error
	// queued is set for OnQueued handlers: the runner gives them the batch's queue.
	queued func(ctx context.Context, q *Queue, e eventstore.Event) error
}

// EventType returns the event type the handler handles.
func (h Handler) EventType() string { return h.eventType }

// On handles events of eventType for a read model in the event store's PostgreSQL database.
// fn gets the batch's transaction: write the read model through tx and the writes commit
// together with the projection's position, so every event is applied exactly once, even if a
// process dies mid-batch. fn must not commit or roll back tx.
//
// The payload is decoded into T with encoding/json; a payload that does not decode fails the
// event with a *DecodeError. Projections with On handlers need the PostgreSQL backend.
func On[T any](eventType string, fn func(ctx context.Context, tx pgx.Tx, e Event[T]) error) Handler {
	return Handler{eventType: eventType, transactional: true, handle: typed(eventType, func(ctx context.Context, tx pgx.Tx, e Event[T]) error {
		return fn(ctx, tx, e)
	}, fn == nil)}
}

// OnIdempotent handles events of eventType for a read model outside the event store's
// database (a cache, a search index, a file, another service). fn gets no transaction: if the
// batch fails or the process dies before the position is committed, the same events are
// handled again, so fn must be idempotent — the delivery is at-least-once.
//
// The payload is decoded into T with encoding/json; a payload that does not decode fails the
// event with a *DecodeError. OnIdempotent handlers work with every backend.
func OnIdempotent[T any](eventType string, fn func(ctx context.Context, e Event[T]) error) Handler {
	return Handler{eventType: eventType, handle: typed(eventType, func(ctx context.Context, _ pgx.Tx, e Event[T]) error {
		return fn(ctx, e)
	}, fn == nil)}
}

// OnAnyIdempotent handles events of every type, with the raw event: a projection with such a
// handler reads the whole store (no type filter), and handlers for specific types, if any, take
// precedence for their types. Delivery is at-least-once, as with OnIdempotent.
func OnAnyIdempotent(fn func(ctx context.Context, e eventstore.Event) error) Handler {
	h := Handler{eventType: anyType}
	if fn != nil {
		h.handle = func(ctx context.Context, _ pgx.Tx, e eventstore.Event) error { return fn(ctx, e) }
	}
	return h
}

// anyType is the event type of an OnAnyIdempotent handler.
const anyType = "*"

func typed[T any](eventType string, fn func(context.Context, pgx.Tx, Event[T]) error, isNil bool) func(context.Context, pgx.Tx, eventstore.Event) error {
	if isNil {
		return nil
	}
	return func(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
		typedEvent := Event[T]{Event: e, Replay: Replaying(ctx)}
		if err := decode(eventType, e, &typedEvent.Data); err != nil {
			return err
		}
		return fn(ctx, tx, typedEvent)
	}
}

// decode unmarshals e's JSON payload into data, a pointer to a handler's T.
func decode(eventType string, e eventstore.Event, data any) error {
	if err := json.Unmarshal(e.Payload, data); err != nil {
		return &DecodeError{EventType: eventType, Target: strings.TrimPrefix(fmt.Sprintf("%T", data), "*"), Err: err}
	}
	return nil
}
