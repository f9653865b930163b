// Package projection defines projections and runs them: each reads the event store forward
// from its own committed position, in batches, and each batch is one unit of work — with
// PostgreSQL one transaction — that writes the read model and advances the position together.
// A batch that fails rolls back whole; the events before the failing one commit in a batch of
// their own, so the position stops right before it and the status names it.
//
// # Defining a projection
//
// New takes a name (it becomes part of queue and table names, so it is validated), a Config
// with the batch size and lifecycle hooks (init, flush, reset, delete, skip) and one handler per
// event type. Only those types are read: the filter runs in the store's query.
//
//   - On[T] — a read model in the event store's PostgreSQL database: the handler writes through
//     the batch's pgx.Tx, so every event is applied exactly once.
//   - OnQueued[T] — the same guarantee for handlers that only write: they queue statements that
//     the runner sends in one round trip per batch (a pgx.Batch), which is several times faster
//     than one round trip per event. A failing statement is charged to its event.
//   - OnIdempotent[T], OnAnyIdempotent — any other read model (a cache, a file, another service):
//     no transaction, at-least-once, so the handler must be idempotent.
//   - Config.FlushFunc — set-based writes once per batch, for the fastest rebuilds.
//
// # Running it
//
// A Runner catches projections up on a Backend: projection/postgres (positions beside the
// events, exactly-once read models) or projection/memory (the embedded demo and fast tests).
// CatchUp runs batches until a read comes back short (everything readable was read); Status
// reports state, position, lag in events and time and whether an open transaction holds the
// projection back; Reset prepares a rebuild; Pause, Resume, Skip and Delete are the operator's actions. Any number of runners in
// any number of processes may run one projection: the backend's lock serialises their batches.
// The runner runs the projection's hooks, each in the backend's unit of work of the state change
// it goes with. Backend is implemented by this module's backends only (see its doc).
//
// What makes a runner catch up is the caller's choice: package worker does it for triggers from
// a broker (the usual mode), Poller does it on an adaptive interval without a broker, and
// projection/postgres's Inline applies projections inside the append's transaction.
//
// # Changing a read model's shape
//
// Config.Version versions a read model. A definition with a higher version than the active one
// runs as a unit of its own (UnitName: "ticket_list.v2"), built from the start beside the
// active version while that one keeps serving; its handlers see history as a replay
// (Replaying, Event.Replay). Its batches that read past the active version's position take
// that version's lock when it is free and handle those events live, claiming them (an active
// version that resumes handles them as history): a stopped active version does not hold the
// build back. Once it is within a batch of the head, one short transaction holding both
// versions' locks handles the rest, points the stable names of Config.Tables (views) at its
// tables (Projection.Table) and makes it active; the old version's batches then do nothing, and
// its DeleteFunc drops its read model after Config.RetireGrace (or Runner.DropRetired). A
// version 1 that wrote a plain table under a stable name is adopted by the first newer version
// that registers (the table renamed name_v1, the name a view of it).
package projection
