package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/nudgeworks/nudge/eventstore"
)

// RunnerConfig configures a Runner. Every field is optional.
type RunnerConfig struct {
	// Logger receives the runner's structured logs; every line carries the projection name.
	// Defaults to slog.Default().
	Logger *slog.Logger
	// NowFunc returns the current time. Defaults to time.Now.
	NowFunc func() time.Time
	// OnBatch, if set, is called after every batch that committed events or failed (not for
	// empty reads, pauses or shutdowns), on the catching-up goroutine: keep it fast. Package
	// metrics uses it for its batch counters and durations.
	OnBatch func(BatchReport)
}

// BatchReport describes one batch, for RunnerConfig.OnBatch.
type BatchReport struct {
	Projection string
	// Events is the number of events the batch committed; 0 when it failed.
	Events int
	// Took is the batch's wall time, from its start to its commit or rollback.
	Took time.Duration
	// Position is the committed position after the batch.
	Position eventstore.Position
	// Err is nil for a committed batch, a *HandlerError when a handler failed on an event
	// (errors.Is(Err, ErrHandler)), and any other error when the batch could not run (the
	// database is down, say).
	Err error
}

// Runner catches projections up: it reads each projection's events forward from the
// projection's own committed position, in batches, each batch one unit of work (one PostgreSQL
// transaction) that writes the read model and advances the position together.
//
// A Runner is safe for concurrent use, and any number of runners, in any number of processes,
// may catch up the same projection at once: the backend's lock serialises their batches, so
// every event is handled once per successful batch and the work is not duplicated.
type Runner struct {
	backend     Backend
	logger      *slog.Logger
	now         func() time.Time
	onBatch     func(BatchReport)
	projections map[string]*Projection
	names       []string

	mu        sync.Mutex
	positions map[string]eventstore.Position // last committed position seen per projection
	running   map[string]chan struct{}       // one catch-up per projection at a time in this runner
}

// NewRunner returns a runner for projections on backend. Names must be unique. Call Init before
// the first catch-up.
func NewRunner(backend Backend, cfg RunnerConfig, projections ...*Projection) (*Runner, error) {
	if backend == nil {
		return nil, fmt.Errorf("%w: NewRunner needs a backend (projection/postgres or projection/memory), got nil", ErrInvalidConfig)
	}
	if len(projections) == 0 {
		return nil, fmt.Errorf("%w: NewRunner needs at least one projection", ErrInvalidConfig)
	}
	r := &Runner{
		backend:     backend,
		logger:      cfg.Logger,
		now:         cfg.NowFunc,
		onBatch:     cfg.OnBatch,
		projections: make(map[string]*Projection, len(projections)),
		positions:   make(map[string]eventstore.Position, len(projections)),
		running:     make(map[string]chan struct{}, len(projections)),
	}
	if r.logger == nil {
		r.logger = slog.Default()
	}
	if r.now == nil {
		r.now = time.Now
	}
	for i, p := range projections {
		if p == nil {
			return nil, fmt.Errorf("%w: projection %d is nil; create projections with projection.New", ErrInvalidConfig, i)
		}
		if _, dup := r.projections[p.name]; dup {
			return nil, fmt.Errorf("%w: two projections are named %s; names must be unique", ErrInvalidConfig, p.name)
		}
		r.projections[p.name] = p
		r.running[p.name] = make(chan struct{}, 1)
		r.names = append(r.names, p.name)
	}
	slices.Sort(r.names)
	return r, nil
}

// Names returns the runner's projection names, sorted.
func (r *Runner) Names() []string { return slices.Clone(r.names) }

// Projection returns the projection called name.
func (r *Runner) Projection(name string) (*Projection, error) {
	p, ok := r.projections[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q; this runner has %v", ErrUnknownProjection, name, r.names)
	}
	return p, nil
}

// Init registers every projection with the backend (creating its status row) and runs its
// init hook. Run it at every start; it is idempotent.
func (r *Runner) Init(ctx context.Context) error {
	for _, name := range r.names {
		if err := r.backend.Register(ctx, r.projections[name]); err != nil {
			return fmt.Errorf("projection %s: init: %w", name, err)
		}
	}
	return nil
}

// Result sums up a CatchUp.
type Result struct {
	// Events is the number of events handled and committed.
	Events int
	// Batches is the number of batches committed.
	Batches int
	// Position is the committed position when CatchUp returned.
	Position eventstore.Position
	// Paused is true when the projection is paused and nothing was done.
	Paused bool
}

// CatchUp handles the projection's events from its committed position until a read comes back
// with fewer events than the batch size (empty or short: everything readable was read). Each batch commits on its own; a failed batch is rolled back and the events before the
// failing one are committed in a batch of their own, so the position stops right before it.
// The failure is recorded in the status (state failing, the event, the error, attempts) and
// returned as a *HandlerError. A cancelled context rolls back the batch in flight, records
// nothing and returns the context's error.
func (r *Runner) CatchUp(ctx context.Context, name string) (Result, error) {
	p, err := r.Projection(name)
	if err != nil {
		return Result{}, err
	}
	// Concurrent catch-ups of one projection in one runner (several triggers at once) would
	// only queue on the backend's lock, each holding a database connection meanwhile: they
	// wait here instead, and find the work done.
	select {
	case r.running[name] <- struct{}{}:
		defer func() { <-r.running[name] }()
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
	var res Result
	for {
		more, err := r.batch(ctx, p, p.cfg.BatchSize, &res)
		if err != nil || !more {
			return res, err
		}
	}
}

// errPaused rolls back a unit that found the projection paused.
var errPaused = errors.New("projection paused")

// batch runs one batch of at most limit events and reports whether more events may be
// readable: it committed events and its read filled the batch. A read that came back short has
// seen everything readable, so the catch-up ends without one more (empty) read; a short read
// of a rebuilding projection also marks the rebuild done.
func (r *Runner) batch(ctx context.Context, p *Projection, limit int, res *Result) (bool, error) {
	var (
		failed     *HandlerError
		failedAt   int
		handled    int
		exhausted  bool // the read came back short and every event it returned was handled
		committed  eventstore.Position
		rebuilding bool
		attempted  bool // a crash-loop attempt was recorded at committed
		crashLoop  bool // failed is a crash-loop verdict
		started    = r.now()
	)
	err := r.backend.RunBatch(ctx, p, func(ctx context.Context, u Unit) (Outcome, error) {
		committed, rebuilding = u.Status.Position, u.Status.State == StateRebuilding
		if u.Status.State == StatePaused {
			return Outcome{}, errPaused
		}
		events, err := u.Read(ctx, u.Status.Position, eventstore.ReadOptions{Limit: limit, Types: p.types, OmitPayload: p.cfg.OmitPayloads})
		if err != nil {
			return Outcome{}, fmt.Errorf("projection %s: read events after %s: %w", p.name, u.Status.Position, err)
		}
		out := Outcome{Position: u.Status.Position, State: u.Status.State}
		exhausted = len(events) < limit
		if len(events) == 0 {
			if u.Status.State == StateRebuilding {
				out.State = StateRunning
			}
			return out, nil
		}
		if limit := p.cfg.CrashLoopLimit; limit > 0 {
			var crashed bool
			read := len(events)
			events, crashed, err = r.watchCrashLoops(ctx, p, u.Status.Position, events, limit)
			exhausted = exhausted && len(events) == read // one event at a time leaves the rest unread
			if err != nil {
				return Outcome{}, err
			}
			attempted = true
			if crashed {
				e := events[0]
				failed, crashLoop = &HandlerError{Projection: p.name, EventID: e.ID, EventType: e.Type, StreamID: e.StreamID,
					Position: e.Position, Err: &CrashLoopError{Starts: limit}}, true
				return Outcome{}, failed
			}
		}
		deadline := started.Add(p.cfg.MaxBatchDuration)
		var queue Queue
		for i := range events {
			if i > 0 && r.now().After(deadline) {
				events, exhausted = events[:i], false
				break
			}
			if err := p.handleInBatch(ctx, u.Tx, &queue, events, i); err != nil {
				return Outcome{}, r.failAt(err, events, &failed, &failedAt)
			}
		}
		if err := p.sendQueue(ctx, u.Tx, &queue, events); err != nil {
			return Outcome{}, r.failAt(err, events, &failed, &failedAt)
		}
		if p.cfg.FlushFunc != nil {
			if err := p.cfg.FlushFunc(ctx, FlushParams{Projection: p.name, Tx: u.Tx, Events: events}); err != nil {
				// A set-based flush cannot say which event it failed on: name the batch's first.
				e := events[0]
				failed, failedAt = &HandlerError{Projection: p.name, EventID: e.ID, EventType: e.Type, StreamID: e.StreamID, Position: e.Position,
					Err: fmt.Errorf("flush hook: %w", err)}, 0
				return Outcome{}, failed
			}
		}
		handled = len(events)
		out.Position = events[len(events)-1].Position
		committed = out.Position
		out.Processed = handled
		if u.Status.State == StateFailing {
			// The failing event is always the first after the position, so a batch that
			// committed events has passed it: the fault is gone.
			out.State, out.ClearFailure = StateRunning, true
		}
		if exhausted && u.Status.State == StateRebuilding {
			out.State = StateRunning
		}
		return out, nil
	})
	if err == nil || errors.Is(err, errPaused) {
		res.Position = committed
		r.remember(p.name, committed, rebuilding)
	}
	if err != nil && attempted && !crashLoop {
		// The batch rolled back without the process dying: it does not count as a crash.
		endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		if endErr := r.backend.EndAttempt(endCtx, p, &committed); endErr != nil {
			r.logger.WarnContext(ctx, "projection: could not clear a batch's start; it may count as a crash",
				slog.String("projection", p.name), slog.Any("error", endErr))
		}
		cancel()
	}
	switch {
	case err == nil:
		if handled > 0 {
			res.Events += handled
			res.Batches++
			took := r.now().Sub(started)
			r.logger.DebugContext(ctx, "projection batch committed", slog.String("projection", p.name),
				slog.Int("events", handled), slog.String("position", res.Position.String()), slog.Duration("took", took))
			r.report(BatchReport{Projection: p.name, Events: handled, Took: took, Position: committed})
		}
		return handled > 0 && !exhausted, nil
	case errors.Is(err, errPaused):
		res.Paused = true
		return false, nil
	case ctx.Err() != nil:
		// Shutting down: the batch rolled back and is not a failure of the projection's.
		return false, ctx.Err()
	case failed == nil:
		r.report(BatchReport{Projection: p.name, Took: r.now().Sub(started), Position: committed, Err: err})
		return false, err
	}

	// A handler failed: commit the events before the failing one, then record the failure.
	if crashLoop {
		r.logger.ErrorContext(ctx, "projection: the process keeps dying on an event; it is not handled again until a replay",
			slog.String("projection", p.name), slog.String("event_id", failed.EventID.String()),
			slog.String("event_type", failed.EventType), slog.String("position", failed.Position.String()))
	}
	if failedAt > 0 {
		if _, err := r.batch(ctx, p, failedAt, res); err != nil {
			return false, err
		}
	}
	r.report(BatchReport{Projection: p.name, Took: r.now().Sub(started), Position: res.Position, Err: failed})
	failure := Failure{
		Event: eventstore.Event{ID: failed.EventID, Type: failed.EventType, StreamID: failed.StreamID, Position: failed.Position},
		Err:   failed.Err,
		At:    r.now(),
	}
	if err := r.backend.RecordFailure(ctx, p, failure); err != nil {
		return false, errors.Join(failed, fmt.Errorf("projection %s: record the failure: %w", p.name, err))
	}
	r.logger.WarnContext(ctx, "projection failed on an event; position stays before it",
		slog.String("projection", p.name), slog.String("event_id", failed.EventID.String()),
		slog.String("event_type", failed.EventType), slog.String("position", failed.Position.String()),
		slog.Any("error", failed.Err))
	return false, failed
}

// failAt records the *HandlerError err as the batch's failure, with the index of its event.
func (r *Runner) failAt(err error, events []eventstore.Event, failed **HandlerError, failedAt *int) error {
	he := err.(*HandlerError) //nolint:errorlint // handleInBatch and sendQueue return *HandlerError itself.
	*failed = he
	for i := range events {
		if events[i].ID == he.EventID {
			*failedAt = i
			break
		}
	}
	return err
}

func (r *Runner) report(b BatchReport) {
	if r.onBatch != nil {
		r.onBatch(b)
	}
}

// remember caches a committed position seen for name. Batches of concurrent catch-ups finish
// in any order, so the cache only moves forward — unless the batch saw the projection rebuilding
// (reset, possibly by another process), which moves it back.
func (r *Runner) remember(name string, p eventstore.Position, rebuilding bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rebuilding || r.positions[name].Less(p) {
		r.positions[name] = p
	}
}

// CommittedPosition returns the last committed position this runner has seen for the
// projection, without asking the backend. A trigger for a position at or before it needs no
// read. It is the zero Position before the first catch-up and right after a Reset.
func (r *Runner) CommittedPosition(name string) eventstore.Position {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.positions[name]
}

// Reset prepares a rebuild: it runs the projection's reset hook and sets its position back to
// the start and its state to rebuilding, in one unit of work. The next catch-up rebuilds the
// read model batch by batch (never holding more than one batch of events in memory) and returns
// the projection to running when it reaches the head. Status shows the progress.
func (r *Runner) Reset(ctx context.Context, name string) error {
	p, err := r.Projection(name)
	if err != nil {
		return err
	}
	if err := r.backend.Reset(ctx, p); err != nil {
		return fmt.Errorf("projection %s: reset: %w", name, err)
	}
	r.mu.Lock()
	delete(r.positions, name)
	r.mu.Unlock()
	r.logger.InfoContext(ctx, "projection reset for a rebuild", slog.String("projection", name))
	return nil
}

// Pause stops catch-up of the projection (in every process) until Resume.
func (r *Runner) Pause(ctx context.Context, name string) error {
	p, err := r.Projection(name)
	if err != nil {
		return err
	}
	if _, err := r.backend.SetState(ctx, p, StatePaused); err != nil {
		return fmt.Errorf("projection %s: pause: %w", name, err)
	}
	r.logger.InfoContext(ctx, "projection paused", slog.String("projection", name))
	return nil
}

// Resume lets a paused projection catch up again. Resuming a projection that is not paused
// changes nothing.
func (r *Runner) Resume(ctx context.Context, name string) error {
	p, err := r.Projection(name)
	if err != nil {
		return err
	}
	changed, err := r.backend.SetState(ctx, p, StateRunning, StatePaused)
	if err != nil {
		return fmt.Errorf("projection %s: resume: %w", name, err)
	}
	if changed {
		r.logger.InfoContext(ctx, "projection resumed", slog.String("projection", name))
	}
	return nil
}

// Delete runs the projection's delete hook and removes its status row. Init creates it again.
func (r *Runner) Delete(ctx context.Context, name string) error {
	p, err := r.Projection(name)
	if err != nil {
		return err
	}
	if err := r.backend.Delete(ctx, p); err != nil {
		return fmt.Errorf("projection %s: delete: %w", name, err)
	}
	r.mu.Lock()
	delete(r.positions, name)
	r.mu.Unlock()
	return nil
}

// Status returns the projection's status and lag.
func (r *Runner) Status(ctx context.Context, name string) (Status, error) {
	p, err := r.Projection(name)
	if err != nil {
		return Status{}, err
	}
	return r.backend.Status(ctx, p)
}

// Statuses returns the status of every projection of the runner, sorted by name.
func (r *Runner) Statuses(ctx context.Context) ([]Status, error) {
	out := make([]Status, 0, len(r.names))
	for _, name := range r.names {
		st, err := r.backend.Status(ctx, r.projections[name])
		if err != nil {
			return nil, fmt.Errorf("projection %s: status: %w", name, err)
		}
		out = append(out, st)
	}
	return out, nil
}

// SkipOptions says who skips an event and why.
type SkipOptions struct {
	// Reason is recorded with the skip. Required.
	Reason string
	// By names the operator or tool. Required.
	By string
	// Force skips the event even when the projection is not failing on it (it must still be
	// the next event the projection would handle).
	Force bool
}

// Skip moves the projection's position past exactly one event, eventID, without handling it:
// an explicit operator action for an event that can never be handled. The event must be the
// next one the projection would handle, and the one it is failing on unless opts.Force. In one
// unit of work the projection's on-skip hook runs (SkipFunc), the position advances past the
// event, the failure is cleared, the state returns to running (a paused projection stays
// paused) and the skip is recorded with who, when and why. Refusals match ErrSkipRefused.
func (r *Runner) Skip(ctx context.Context, name string, eventID uuid.UUID, opts SkipOptions) (eventstore.Event, error) {
	p, err := r.Projection(name)
	if err != nil {
		return eventstore.Event{}, err
	}
	if strings.TrimSpace(opts.Reason) == "" || strings.TrimSpace(opts.By) == "" {
		return eventstore.Event{}, fmt.Errorf("%w: projection %s: a skip needs a reason and who does it", ErrSkipRefused, name)
	}
	var skipped eventstore.Event
	err = r.backend.RunBatch(ctx, p, func(ctx context.Context, u Unit) (Outcome, error) {
		st := u.Status
		if !opts.Force && (st.FailingEvent == nil || st.FailingEvent.ID != eventID) {
			failing := "is not failing"
			if st.FailingEvent != nil {
				failing = "is failing on event " + st.FailingEvent.ID.String()
			}
			return Outcome{}, fmt.Errorf("%w: projection %s %s, not on %s; pass Force to skip another event", ErrSkipRefused, name, failing, eventID)
		}
		next, err := u.Read(ctx, st.Position, eventstore.ReadOptions{Limit: 1, Types: p.types})
		if err != nil {
			return Outcome{}, err
		}
		if len(next) == 0 || next[0].ID != eventID {
			nextID := "nothing"
			if len(next) > 0 {
				nextID = "event " + next[0].ID.String()
			}
			return Outcome{}, fmt.Errorf("%w: event %s is not the next event of projection %s (next is %s); only that one can be skipped",
				ErrSkipRefused, eventID, name, nextID)
		}
		skipped = next[0]
		if fn := p.cfg.SkipFunc; fn != nil {
			if err := fn(ctx, SkipParams{Projection: name, Tx: u.Tx, Event: skipped, Reason: opts.Reason, By: opts.By}); err != nil {
				return Outcome{}, fmt.Errorf("projection %s: on-skip hook: %w", name, err)
			}
		}
		state := StateRunning
		if st.State == StatePaused || st.State == StateRebuilding {
			state = st.State
		}
		return Outcome{
			Position: skipped.Position, State: state, ClearFailure: true,
			Skip: &SkipRecord{
				Event: FailingEvent{Position: skipped.Position, ID: skipped.ID, Type: skipped.Type, StreamID: skipped.StreamID},
				By:    opts.By, Reason: opts.Reason, At: r.now(), Forced: opts.Force,
			},
		}, nil
	})
	if err != nil {
		return eventstore.Event{}, err
	}
	r.remember(name, skipped.Position, false)
	r.logger.WarnContext(ctx, "projection skipped an event", slog.String("projection", name),
		slog.String("event_id", skipped.ID.String()), slog.String("event_type", skipped.Type),
		slog.String("position", skipped.Position.String()), slog.String("by", opts.By), slog.String("reason", opts.Reason))
	return skipped, nil
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

// ClearCrashLoop lets the projection handle again an event it was judged to die on (after a
// fix): the next batch there runs the handler, one event at a time. Workers call it for replay
// triggers.
func (r *Runner) ClearCrashLoop(ctx context.Context, name string) error {
	p, err := r.Projection(name)
	if err != nil {
		return err
	}
	return r.backend.EndAttempt(ctx, p, nil)
}
