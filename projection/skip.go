package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/eventstore"
)

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
//
// In a partitioned projection the skip moves the position of the partition whose next event
// is eventID.
func (r *Runner) Skip(ctx context.Context, name string, eventID uuid.UUID, opts SkipOptions) (eventstore.Event, error) {
	p, err := r.Projection(name)
	if err != nil {
		return eventstore.Event{}, err
	}
	if strings.TrimSpace(opts.Reason) == "" || strings.TrimSpace(opts.By) == "" {
		return eventstore.Event{}, fmt.Errorf("%w: projection %s: a skip needs a reason and who does it", ErrSkipRefused, name)
	}
	var refusals []error
	for _, u := range p.Units() {
		e, err := r.skip(ctx, u, eventID, opts)
		if !errors.Is(err, ErrSkipRefused) || !p.Partitioned() {
			return e, err
		}
		refusals = append(refusals, err)
	}
	return eventstore.Event{}, fmt.Errorf("%w: projection %s: no partition's next event is %s: %w", ErrSkipRefused, name, eventID, errors.Join(refusals...))
}

// skip is Skip in the unit p.
func (r *Runner) skip(ctx context.Context, p *Projection, eventID uuid.UUID, opts SkipOptions) (eventstore.Event, error) {
	name := p.name
	var skipped eventstore.Event
	err := r.backend.RunBatch(ctx, p, nil, func(ctx context.Context, u Unit) (Outcome, error) {
		if err := checkFailingOn(name, u.Status, eventID, opts.Force); err != nil {
			return Outcome{}, err
		}
		e, err := nextEvent(ctx, p, u, eventID)
		if err != nil {
			return Outcome{}, err
		}
		if err := p.onSkip(ctx, u.Tx, e, opts); err != nil {
			return Outcome{}, err
		}
		skipped = e
		return skipOutcome(u.Status, e, opts, r.now()), nil
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

// checkFailingOn refuses a skip of eventID unless the projection (in status st) is failing on
// it, or force.
func checkFailingOn(name string, st Status, eventID uuid.UUID, force bool) error {
	if force || (st.FailingEvent != nil && st.FailingEvent.ID == eventID) {
		return nil
	}
	failing := "is not failing"
	if st.FailingEvent != nil {
		failing = "is failing on event " + st.FailingEvent.ID.String()
	}
	return fmt.Errorf("%w: projection %s %s, not on %s; pass Force to skip another event", ErrSkipRefused, name, failing, eventID)
}

// nextEvent returns the next event the projection would handle, which must be eventID.
func nextEvent(ctx context.Context, p *Projection, u Unit, eventID uuid.UUID) (eventstore.Event, error) {
	next, err := u.Read(ctx, u.Status.Position, eventstore.ReadOptions{Limit: 1, Types: p.types, Partition: p.partition})
	if err != nil {
		return eventstore.Event{}, err
	}
	if len(next) == 0 || next[0].ID != eventID {
		nextID := "nothing"
		if len(next) > 0 {
			nextID = "event " + next[0].ID.String()
		}
		return eventstore.Event{}, fmt.Errorf("%w: event %s is not the next event of projection %s (next is %s); only that one can be skipped",
			ErrSkipRefused, eventID, p.name, nextID)
	}
	return next[0], nil
}

// onSkip runs the projection's on-skip hook, if it has one.
func (p *Projection) onSkip(ctx context.Context, tx pgx.Tx, e eventstore.Event, opts SkipOptions) error {
	fn := p.cfg.SkipFunc
	if fn == nil {
		return nil
	}
	if err := fn(ctx, SkipParams{Projection: p.name, Tx: tx, Event: e, Reason: opts.Reason, By: opts.By}); err != nil {
		return fmt.Errorf("projection %s: on-skip hook: %w", p.name, err)
	}
	return nil
}

// skipOutcome moves the position past the skipped event e, found in status st, and records
// the skip. The state returns to running, except from paused or rebuilding.
func skipOutcome(st Status, e eventstore.Event, opts SkipOptions, at time.Time) Outcome {
	state := StateRunning
	if st.State == StatePaused || st.State == StateRebuilding {
		state = st.State
	}
	return Outcome{
		Position: e.Position, State: state, ClearFailure: true,
		Skip: &SkipRecord{
			Event: e.Ref(),
			By:    opts.By, Reason: opts.Reason, At: at, Forced: opts.Force,
		},
	}
}
