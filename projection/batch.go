package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/tracing"
)

// errPaused rolls back a unit that found the projection paused; errRetired one that found its
// version retired.
var (
	errPaused  = errors.New("projection paused")
	errRetired = errors.New("projection version retired")
)

// step runs one batch of a catch-up and reports whether more events may be readable. When a
// handler fails, the batch rolls back; step then commits the events before the failing one in
// a batch of their own (the good prefix), so the position stops right before it, and records
// the failure. The good prefix may fail in turn, on an earlier event: then that failure is the
// one recorded, and its own good prefix is committed first.
func (r *Runner) step(ctx context.Context, p *Projection, res *Result, limit int) (bool, error) {
	var failing *batch
	for ; ; limit = failing.failedAt {
		b := r.newBatch(p, limit)
		more, err := b.run(ctx, res)
		if !b.failedOnEvent {
			if failing != nil && err == nil {
				break // the good prefix committed (or the projection was paused meanwhile)
			}
			return more, err
		}
		failing = b
		if b.failedAt == 0 {
			break // no good prefix
		}
	}
	err := failing.recordFailure(ctx, res)
	if failing.park(ctx, res) {
		return true, nil // the stream is parked; the catch-up goes on past the event
	}
	return false, err
}

// batch is one batch of a catch-up: at most limit events read after the projection's committed
// position and handled in one unit of work (one PostgreSQL transaction), which commits them
// together with the new position. Its steps: read, the crash-loop guard, handle, flush, then
// commit; a batch that failed on an event rolls back and records the failure after its good
// prefix is committed (Runner.step).
type batch struct {
	r       *Runner
	p       *Projection
	limit   int
	started time.Time

	// committed is the projection's position after the unit: the one it found, or the last
	// event's of a batch that handled events.
	committed eventstore.Position
	// rebuilding: the unit found the projection rebuilding.
	rebuilding bool
	// version is the unit's version record; building: the unit runs a building version's
	// history, up to version.ActivePosition; cutOver: the batch runs in a cut-over.
	version           VersionInfo
	building, cutOver bool
	// exhausted: the read came back short and every event it returned was handled, so
	// everything readable has been read.
	exhausted bool
	// attempted: a crash-loop attempt was recorded at the position the unit found.
	attempted bool
	// handled is the number of events the batch handled (and committed, if the unit did);
	// passed adds the events of parked streams it held.
	handled, passed int
	// read are the events the unit read, in order.
	readEvents []eventstore.Event

	// failed is the event a handler, the flush hook or the crash-loop guard failed on, and
	// failedAt its index among the events read.
	failed   *HandlerError
	failedAt int
	// crashLoop: failed is a crash-loop verdict.
	crashLoop bool
	// failedOnEvent: the batch ended because of failed (not because the context ended first).
	failedOnEvent bool
	// unattributed: failed is a flush hook's error that named no event.
	unattributed bool

	// parked are the projection's parked streams, as the unit found them; held counts the
	// events of those streams the batch passed without handling them.
	parked map[string]ParkedStream
	held   map[string]Held
	// statements are the OnQueued handlers' statements left to the backend's commit.
	statements *Statements

	// span is the batch's span; traced, when it records, is when it started.
	span   trace.Span
	traced time.Time
	// locked is when the unit of work started (its lock taken); recorded are the handled
	// events' RecordedAt and commitClock the store's clock at the commit (Outcome.CommitClock).
	locked      time.Time
	recorded    []time.Time
	commitClock time.Time
}

func (r *Runner) newBatch(p *Projection, limit int) *batch {
	return &batch{r: r, p: p, limit: limit, started: r.now(), span: tracing.NoSpan()}
}

// run runs the batch's unit of work and sums up its result in res. It reports whether more
// events may be readable: the batch committed events and its read filled the batch. A read that
// came back short has seen everything readable, so the catch-up ends without one more (empty)
// read. A batch that failed on an event sets failedOnEvent and returns its *HandlerError,
// recorded nowhere yet.
func (b *batch) run(ctx context.Context, res *Result) (bool, error) {
	ctx, b.span = b.r.tracer.Start(ctx, tracing.SpanBatch, trace.SpanKindInternal)
	if b.span.IsRecording() {
		b.traced = time.Now()
		b.span.SetAttributes(tracing.AttrProjection.String(b.p.name))
	}
	more, err := b.runUnit(ctx, res)
	b.endSpan(ctx, res, err)
	return more, err
}

// endSpan ends the batch's span with the batch's outcome.
func (b *batch) endSpan(ctx context.Context, res *Result, err error) {
	if !b.span.IsRecording() {
		b.span.End()
		return
	}
	outcome := tracing.OutcomeCommitted
	switch {
	case err != nil && ctx.Err() != nil:
		outcome = tracing.OutcomeCanceled
	case err != nil:
		outcome = tracing.OutcomeFailed
	case res.Retired:
		outcome = tracing.OutcomeRetired
	case res.Paused:
		outcome = tracing.OutcomePaused
	case b.passed == 0:
		outcome = tracing.OutcomeEmpty
	}
	b.span.SetAttributes(tracing.AttrOutcome.String(outcome), tracing.AttrEvents.Int(b.handled),
		tracing.AttrPositionTo.String(b.committed.String()))
	tracing.End(b.span, err)
}

// traceUnit puts on the batch's span the time it waited for the projection's lock, where it
// read from, and links to the appends of the events it read.
func (b *batch) traceUnit(from eventstore.Position, events []eventstore.Event) {
	if !b.span.IsRecording() {
		return
	}
	links := tracing.LinkEvents(b.span, events)
	b.span.SetAttributes(tracing.AttrPositionFrom.String(from.String()), tracing.AttrLinks.Int(links))
}

// traceFailure adds a handler's failure to the batch's span as an event.
func (b *batch) traceFailure(he *HandlerError) {
	if !b.span.IsRecording() {
		return
	}
	b.span.AddEvent("nudge.handler.failed", trace.WithAttributes(
		attribute.String("nudge.event.id", he.Event.ID.String()), attribute.String("nudge.event.type", he.Event.Type),
		attribute.String("nudge.event.position", he.Event.Position.String()), attribute.String("error", he.Err.Error())))
}

// runUnit is run's work.
func (b *batch) runUnit(ctx context.Context, res *Result) (bool, error) {
	unitCtx, cancel := context.WithTimeout(ctx, b.p.cfg.BatchTimeout)
	defer cancel()
	err := b.r.backend.RunBatch(unitCtx, b.p, b.readAhead(), b.unit)
	if err != nil && ctx.Err() == nil && unitCtx.Err() != nil {
		// The batch's own deadline ended it, whatever a handler made of that: not the event's
		// fault, so the error keeps the cause's text but not its *HandlerError.
		b.failed, b.failedAt = nil, 0
		err = fmt.Errorf("projection %s: %w (%s): %v", b.p.name, ErrBatchTimeout, b.p.cfg.BatchTimeout, err) //nolint:errorlint // see above.
	}
	res.version = b.version
	if errors.Is(err, errRetired) {
		res.Retired = true
		return false, nil
	}
	res.building = res.building || b.building
	if err == nil || errors.Is(err, errPaused) {
		res.Position = b.committed
		b.r.remember(b.p.name, b.committed, b.rebuilding)
	}
	if err != nil && b.attempted && !b.crashLoop {
		b.endAttempt(ctx)
	}
	switch {
	case err == nil:
		return b.committedEvents(ctx, res), nil
	case errors.Is(err, errPaused):
		res.Paused = true
		return false, nil
	case ctx.Err() != nil:
		// Shutting down: the batch rolled back and is not a failure of the projection's.
		return false, ctx.Err()
	case b.failed == nil:
		b.r.report(BatchReport{Projection: b.p.name, Took: b.r.now().Sub(b.started), Position: b.committed, Err: err})
		return false, err
	}
	b.failedOnEvent = true
	return false, b.failed
}

// unit is the batch's work inside the backend's unit of work, which commits the Outcome it
// returns, or rolls back on an error.
func (b *batch) unit(ctx context.Context, u Unit) (Outcome, error) {
	if b.span.IsRecording() {
		b.span.SetAttributes(tracing.AttrLockWait.Float64(time.Since(b.traced).Seconds()))
	}
	b.locked = b.r.now()
	st := u.Status
	b.committed, b.rebuilding = st.Position, st.State == StateRebuilding
	b.version, b.building = u.Version, u.Version.State == VersionBuilding && !b.cutOver
	if u.Version.State == VersionRetired && !b.cutOver {
		return Outcome{}, errRetired // a newer version took over: nothing runs here any more
	}
	if st.State == StatePaused {
		return Outcome{}, errPaused
	}
	events, err := b.read(ctx, u)
	if err != nil {
		return Outcome{}, err
	}
	b.traceUnit(st.Position, events)
	if len(events) == 0 {
		out := Outcome{Position: st.Position, State: st.State}
		if b.rebuilding {
			out.State = StateRunning // a rebuild that reached the head is done
		}
		return out, nil
	}
	if events, err = b.guardCrashLoop(ctx, st.Position, events); err != nil {
		return Outcome{}, err
	}
	b.parked = u.Parked
	passed, handled, err := b.handle(ctx, u.Tx, events)
	if err != nil {
		return Outcome{}, err
	}
	if err := b.flush(ctx, u.Tx, handled); err != nil {
		return Outcome{}, err
	}
	out := b.outcome(st, passed, len(handled))
	out.Statements = b.statements
	b.recorded = b.recorded[:0]
	for i := range handled {
		b.recorded = append(b.recorded, handled[i].RecordedAt)
	}
	out.CommitClock = &b.commitClock
	return out, nil
}

// readOptions are the options of the batch's read.
func (b *batch) readOptions() eventstore.ReadOptions {
	return eventstore.ReadOptions{Limit: b.limit, Types: b.p.types, OmitPayload: b.p.cfg.OmitPayloads, Partition: b.p.partition}
}

// readAhead is the read the batch expects to make: after the position this runner last saw
// committed for the unit. Nil before the runner has seen one (a batch would read from the
// start for nothing if the projection is further on).
func (b *batch) readAhead() *ReadAhead {
	at := b.r.CommittedPosition(b.p.name) // a unit's own: partitions are units
	if at.IsZero() {
		return nil
	}
	return &ReadAhead{After: at, Options: b.readOptions()}
}

// read reads the batch's events after the position the unit found.
func (b *batch) read(ctx context.Context, u Unit) ([]eventstore.Event, error) {
	events, err := u.Read(ctx, u.Status.Position, b.readOptions())
	if err != nil {
		return nil, fmt.Errorf("projection %s: read events after %s: %w", b.p.name, u.Status.Position, err)
	}
	b.exhausted = len(events) < b.limit
	if b.building && u.Claim != nil && len(events) > 0 && b.version.ActivePosition.Less(events[len(events)-1].Position) {
		// The read reaches past the active version's position: the batch claims those events
		// if it can take the active version's locks now.
		if b.version, err = u.Claim(ctx); err != nil {
			return nil, fmt.Errorf("projection %s: claim the events after the active version's position: %w", b.p.name, err)
		}
	}
	if b.building && !b.version.Claiming {
		// History only: the events after the active version's position are handled in a
		// batch that claims them or in the cut-over, under its lock, so that none is live in
		// both versions.
		n := len(events)
		events = slices.DeleteFunc(events, func(e eventstore.Event) bool { return b.version.ActivePosition.Less(e.Position) })
		b.exhausted = b.exhausted || len(events) < n
	}
	b.readEvents = events
	return events, nil
}

// guardCrashLoop records the batch's start, when crash-loop detection is on, and returns the
// events the batch may handle: all, only the first (in a range where the process died), or
// none, with a crash-loop verdict as the batch's failure.
func (b *batch) guardCrashLoop(ctx context.Context, at eventstore.Position, events []eventstore.Event) ([]eventstore.Event, error) {
	limit := b.p.cfg.CrashLoopLimit
	if limit <= 0 || b.cutOver {
		return events, nil
	}
	read := len(events)
	events, crashed, err := b.r.watchCrashLoops(ctx, b.p, at, events, limit)
	b.exhausted = b.exhausted && len(events) == read // one event at a time leaves the rest unread
	if err != nil {
		return nil, err
	}
	b.attempted = true
	if crashed {
		b.failed, b.crashLoop = b.p.handlerError(events[0], &CrashLoopError{Starts: limit}), true
		return nil, b.failed
	}
	return events, nil
}

// watchCrashLoops records that a batch of events starts after position at and decides what the
// batch may do: all of events, only the first (the range where the process died is searched one
// event at a time), or nothing, when the process died limit times on the first (crashed).
func (r *Runner) watchCrashLoops(ctx context.Context, p *Projection, at eventstore.Position, events []eventstore.Event, limit int) ([]eventstore.Event, bool, error) {
	att, err := r.backend.StartAttempt(ctx, p, at, eventstore.Position{})
	if errors.Is(err, ErrAttemptNotRecorded) {
		r.logger.WarnContext(ctx, "projection: crash-loop tracking skipped for a batch", slog.String("projection", p.name), slog.Any("error", err))
		return events, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("projection %s: record the batch's start: %w", p.name, err)
	}
	careful := !att.CarefulUntil.IsZero() && at.Less(att.CarefulUntil)
	if att.Starts > limit && len(events) > 1 && !careful {
		last := events[len(events)-1].Position
		if att, err = r.backend.StartAttempt(ctx, p, at, last); err != nil {
			return nil, false, fmt.Errorf("projection %s: record the batch's start: %w", p.name, err)
		}
		careful = true
		r.logger.WarnContext(ctx, "projection: the process stopped during batches here; handling one event per batch to find the event",
			slog.String("projection", p.name), slog.String("position", at.String()), slog.Int("starts", limit))
	}
	if careful {
		events = events[:1]
	}
	return events, att.Starts > limit && len(events) == 1, nil
}

// handle runs the handlers on events in order and sends the statements they queued; events
// of parked streams are held instead (counted, not handled). Once the batch has taken
// MaxBatchDuration it stops before the next event (the first always runs). It returns the
// events it passed (handled or held), a prefix of events, and those it handled.
func (b *batch) handle(ctx context.Context, tx pgx.Tx, events []eventstore.Event) (passed, handled []eventstore.Event, err error) {
	deadline := b.started.Add(b.p.cfg.MaxBatchDuration)
	live, replay := ctx, withReplay(ctx)
	var queue Queue
	handled = events[:0:0]
	for i := range events {
		if i > 0 && b.r.now().After(deadline) {
			events, b.exhausted = events[:i], false
			break
		}
		if b.hold(events[i]) {
			continue
		}
		eventCtx := live
		if b.replays(events[i]) {
			eventCtx = replay
		}
		if err := b.p.handleInBatch(eventCtx, tx, &queue, events, i); err != nil {
			return nil, nil, b.failAt(err, events)
		}
		handled = append(handled, events[i])
	}
	if tx != nil && b.p.cfg.FlushFunc == nil && !b.cutOver && queue.Len() > 0 {
		// Nothing runs between the last handler and the commit: the statements go in the
		// commit's round trip (Outcome.Statements). Not in a cut-over, whose batches follow
		// one another in one transaction before their outcomes are stored.
		b.statements = &Statements{q: queue, fail: func(owner int, err error) error {
			return b.failAt(b.p.handlerError(events[owner], err), events)
		}}
		return events, handled, nil
	}
	if err := b.p.sendQueue(ctx, tx, &queue, events); err != nil {
		return nil, nil, b.failAt(err, events)
	}
	return events, handled, nil
}

// replays reports whether the batch handles e as history (Replaying): in a building
// version's batch, every event the active version has handled (all of them, unless the batch
// claims); in a cut-over, the same (it moved on since the building version was last level
// with it); in the active version's batch, an event a building version claimed.
func (b *batch) replays(e eventstore.Event) bool {
	switch {
	case b.building:
		return !b.version.Claiming || b.version.activeHandled(e)
	case b.version.State == VersionBuilding:
		return b.cutOver && b.version.activeHandled(e)
	}
	return b.version.claimed(e)
}

// failAt records the *HandlerError err as the batch's failure, with the index of its event.
func (b *batch) failAt(err error, events []eventstore.Event) error {
	he := err.(*HandlerError) //nolint:errorlint // handleInBatch and sendQueue return *HandlerError itself.
	b.failed = he
	b.traceFailure(he)
	for i := range events {
		if events[i].ID == he.Event.ID {
			b.failedAt = i
			break
		}
	}
	return err
}

// flush runs the flush hook on the handled events.
func (b *batch) flush(ctx context.Context, tx pgx.Tx, events []eventstore.Event) error {
	fn := b.p.cfg.FlushFunc
	if fn == nil {
		return nil
	}
	if len(events) == 0 {
		return nil // every event was held
	}
	if err := fn(ctx, FlushParams{Projection: b.p.name, Tx: tx, Events: events}); err != nil {
		// A set-based flush cannot say which event it failed on, unless its error names one
		// (FlushFailedOn): else the batch's first is named, and the failure is not parked.
		he := flushError(b.p, events, err)
		b.failed, b.unattributed = he, he.unattributed
		b.traceFailure(he)
		b.failedAt = slices.IndexFunc(b.readEvents, func(e eventstore.Event) bool { return e.ID == he.Event.ID })
		return b.failed
	}
	return nil
}

// outcome is what the unit commits for the passed events (handled handled, the others held),
// found in the state st.
func (b *batch) outcome(st Status, passed []eventstore.Event, handled int) Outcome {
	out := Outcome{Position: passed[len(passed)-1].Position, State: st.State, Processed: handled, Held: b.held}
	b.handled, b.passed, b.committed = handled, len(passed), out.Position
	if st.State == StateFailing {
		// The failing event is always the first after the position, so a batch that
		// committed events has passed it: the fault is gone.
		out.State, out.ClearFailure = StateRunning, true
	}
	if b.exhausted && st.State == StateRebuilding {
		out.State = StateRunning
	}
	return out
}

// committedEvents sums up a committed batch in res, logs and reports it, and reports whether
// more events may be readable.
func (b *batch) committedEvents(ctx context.Context, res *Result) bool {
	if b.passed == 0 {
		return false
	}
	res.Events += b.handled
	res.Batches++
	took := b.r.now().Sub(b.started)
	b.r.logger.DebugContext(ctx, "projection batch committed", slog.String("projection", b.p.name),
		slog.Int("events", b.handled), slog.String("position", res.Position.String()), slog.Duration("took", took))
	b.r.report(BatchReport{Projection: b.p.name, Events: b.handled, Took: took, Position: b.committed,
		Staleness: b.staleness(), LockWait: b.locked.Sub(b.started)})
	return !b.exhausted
}

// staleness is, per handled event, the time from its RecordedAt to the commit: in the store's
// clock when the backend read it, else in the host's. None for a rebuild's or a building
// version's batch: their events are history, whose age is not staleness.
func (b *batch) staleness() []time.Duration {
	if len(b.recorded) == 0 || b.rebuilding || b.building {
		return nil
	}
	commit := b.commitClock
	if commit.IsZero() {
		commit = b.r.now()
	}
	out := make([]time.Duration, len(b.recorded))
	for i, at := range b.recorded {
		out[i] = max(commit.Sub(at), 0)
	}
	return out
}

// endAttempt forgets the batch's crash-loop attempt: it rolled back without the process dying,
// which does not count as a crash.
func (b *batch) endAttempt(ctx context.Context) {
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := b.r.backend.EndAttempt(endCtx, b.p, &b.committed); err != nil {
		b.r.logger.WarnContext(ctx, "projection: could not clear a batch's start; it may count as a crash",
			slog.String("projection", b.p.name), slog.Any("error", err))
	}
}

// recordFailure reports the batch's failure and records it in the projection's status, once
// the good prefix is committed (res.Position), and returns it.
func (b *batch) recordFailure(ctx context.Context, res *Result) error {
	failed := b.failed
	// The lines about the failure join the failed batch's span (ended, with its failure as an
	// event), not only the trigger's: a catch-up without a trigger has no other.
	logCtx := ctx
	if b.span.SpanContext().IsValid() {
		logCtx = trace.ContextWithSpan(ctx, b.span)
	}
	if b.crashLoop {
		b.r.logger.ErrorContext(logCtx, "projection: the process keeps dying on an event; it is not handled again until a replay",
			slog.String("projection", b.p.name), slog.String("event_id", failed.Event.ID.String()),
			slog.String("event_type", failed.Event.Type), slog.String("position", failed.Event.Position.String()))
	}
	b.r.report(BatchReport{Projection: b.p.name, Took: b.r.now().Sub(b.started), Position: res.Position, Err: failed})
	recordCtx, cancel := context.WithTimeout(ctx, b.p.cfg.BatchTimeout)
	defer cancel()
	if err := b.r.backend.RecordFailure(recordCtx, b.p, Failure{Event: failed.Event, Err: failed.Err, At: b.r.now()}); err != nil {
		return errors.Join(failed, fmt.Errorf("projection %s: record the failure: %w", b.p.name, err))
	}
	b.r.logger.WarnContext(logCtx, "projection failed on an event; position stays before it",
		slog.String("projection", b.p.name), slog.String("event_id", failed.Event.ID.String()),
		slog.String("event_type", failed.Event.Type), slog.String("position", failed.Event.Position.String()),
		slog.Any("error", failed.Err))
	return failed
}
