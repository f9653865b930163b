package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/trace"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/tracing"
)

// activate tries the cut-over of p, a building version (the definition of a partitioned one)
// whose catch-up has handled all the history it may (it is level with the active version):
// one unit of work that holds both versions' locks brings every unit of p to the head and
// makes p active (Backend.Activate). A handler that fails in the cut-over rolls all of it back;
// the failure is recorded on the failing unit only (its status fails, a worker retries and
// dead-letters its trigger), and it blocks only the cut-over: the active version goes on
// serving. caller is the unit whose catch-up just found it level: it is not asked whether it is
// behind (what the active version handled meanwhile is a cut-over's work, as for an
// unpartitioned projection). It reports whether the cut-over waited because another unit was
// behind.
func (r *Runner) activate(ctx context.Context, p, caller *Projection, res *Result) (behind bool, err error) {
	ctx, span := r.tracer.Start(ctx, tracing.SpanCutOver, trace.SpanKindInternal)
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrProjection.String(p.name), tracing.AttrVersion.Int(p.cfg.Version))
	}
	events := res.Events
	behind, err = r.activateIn(ctx, p, caller, res)
	if span.IsRecording() {
		outcome := "waiting"
		if res.Activated {
			outcome = "activated"
		}
		span.SetAttributes(tracing.AttrOutcome.String(outcome), tracing.AttrEvents.Int(res.Events-events))
	}
	tracing.End(span, err)
	return behind, err
}

// activateIn is activate's work.
func (r *Runner) activateIn(ctx context.Context, p, caller *Projection, res *Result) (behind bool, err error) {
	unitCtx, cancel := context.WithTimeout(ctx, p.cfg.BatchTimeout)
	defer cancel()
	var failed *batch
	act, err := r.backend.Activate(unitCtx, p, r.cutOver(&failed, caller), hook("activate", p, p.cfg.ActivateFunc))
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		if unitCtx.Err() != nil {
			// The cut-over's own deadline ended it, as a batch's does (batch.runUnit): not an
			// event's fault, whatever a handler or the hook made of it, so nothing is recorded.
			// The error keeps the cause's text, not its *HandlerError, and matches
			// context.DeadlineExceeded too: a worker nacks the trigger at once, as it always
			// has for a cut-over past its deadline, rather than retrying it in the handler.
			return false, fmt.Errorf("projection %s: cut-over to version %d: %w (%s): %w: %v",
				p.name, p.cfg.Version, ErrBatchTimeout, p.cfg.BatchTimeout, context.DeadlineExceeded, err) //nolint:errorlint // the cause's text only, as in runUnit.
		}
		if failed != nil && failed.failed != nil && errors.Is(err, ErrHandler) {
			return false, failed.recordFailure(ctx, res)
		}
		return false, fmt.Errorf("projection %s: cut-over to version %d: %w", p.name, p.cfg.Version, err)
	}
	if !act.Activated {
		r.logger.DebugContext(ctx, "projection version not cut over yet", slog.String("projection", p.name),
			slog.Int("version", p.cfg.Version), slog.String("reason", act.Reason))
		return act.Behind, nil
	}
	res.Activated, res.CutOverHeld = true, act.Held
	res.Events += act.Events
	res.Position = r.CommittedPosition(p.name)
	r.report(BatchReport{Projection: p.name, Events: act.Events, Took: act.Held, Position: res.Position})
	r.logger.InfoContext(ctx, "projection version cut over: readers now see it", slog.String("projection", p.name),
		slog.Int("version", p.cfg.Version), slog.Int("previous", act.Previous), slog.Int("events", act.Events),
		slog.Duration("held", act.Held))
	return false, nil
}

// cutOverBatches bounds the events a cut-over handles on one unit, in batches of the unit's
// Config.BatchSize: a unit with this many left to the head is behind (its own batches claim
// them, past a stopped active version), and so is one with a full batch of history left. A
// unit level with an active version that runs but lags under load (its lock is seldom free
// to claim past it) cuts over with what the active version has not handled yet, within this
// bound: with one batch to the head as the bound, make chaos-loaded's repartition never cut
// over (the active version lagged 600 events behind the head for minutes).
const cutOverBatches = 4

// cutOver is the cut-over's work on each unit of the building version: whether it is behind
// (a full batch of history left, or cutOverBatches batches of events left to the head; never
// caller, the unit just found level), then
// batches of the events after its position until a read comes back short, their outcomes
// summed into one. Events the active version handled
// meanwhile are history (Replaying); the rest are live. It sets *failed to the batch that
// failed, if one does.
func (r *Runner) cutOver(failed **batch, caller *Projection) CutOver {
	return CutOver{
		Behind: func(ctx context.Context, p *Projection, u Unit) (bool, error) {
			if p.name == caller.name {
				return false, nil
			}
			limit := p.cfg.BatchSize
			events, err := u.Read(ctx, u.Status.Position, eventstore.ReadOptions{Limit: cutOverBatches * limit, Types: p.types, OmitPayload: true, Partition: p.partition})
			if err != nil {
				return false, fmt.Errorf("projection %s: read events after %s: %w", p.name, u.Status.Position, err)
			}
			if len(events) == cutOverBatches*limit {
				return true, nil // too much left to the head for one short transaction: claims get it there
			}
			// A full batch of history left: the unit's own batches build it first.
			return len(events) >= limit && !u.Version.ActivePosition.Less(events[limit-1].Position), nil
		},
		Run: func(ctx context.Context, p *Projection, u Unit) (Outcome, error) {
			total := Outcome{Position: u.Status.Position, State: u.Status.State}
			for {
				b := r.newBatch(p, p.cfg.BatchSize)
				b.cutOver = true
				out, err := b.unit(ctx, u)
				if err != nil {
					*failed = b
					return Outcome{}, err
				}
				total.Position, total.State = out.Position, out.State
				total.Processed += out.Processed
				total.ClearFailure = total.ClearFailure || out.ClearFailure
				u.Status.Position, u.Status.State = out.Position, out.State
				if b.passed == 0 || b.exhausted {
					r.remember(p.name, total.Position, false)
					return total, nil
				}
			}
		},
	}
}

// dropAfterGrace drops a retired version's read model (its DeleteFunc) once Config.RetireGrace
// has passed since it was retired; a negative grace keeps it.
func (r *Runner) dropAfterGrace(ctx context.Context, p *Projection, v VersionInfo) error {
	grace := p.cfg.RetireGrace
	if grace < 0 || !v.DroppedAt.IsZero() || v.RetiredAt.IsZero() || r.now().Before(v.RetiredAt.Add(grace)) {
		return nil
	}
	return r.DropRetired(ctx, p.Definition().name)
}

// dropTablesAfterGrace drops the read model of old, a retired version of p's projection,
// when this runner does not have old's definition (its code is gone: no runner would run its
// DeleteFunc) and p's Config.RetireGrace has passed since old was retired: the backend drops
// the versioned tables of the stable names recorded for old (Backend.DropRetiredTables). A
// failure is logged, not returned: it is no failure of p's, and the next catch-up tries again.
func (r *Runner) dropTablesAfterGrace(ctx context.Context, p *Projection, old RetiredVersion) {
	unit, err := UnitName(p.base, old.Version)
	if _, known := r.projections[unit]; err != nil || known {
		return // its own definition drops it, with its DeleteFunc
	}
	grace := p.cfg.RetireGrace
	if grace < 0 || old.RetiredAt.IsZero() || r.now().Before(old.RetiredAt.Add(grace)) {
		return
	}
	if err := r.dropTables(ctx, p, old.Version); err != nil {
		r.logger.WarnContext(ctx, "projection: dropping a retired version's tables failed; the next catch-up tries again",
			slog.String("projection", p.name), slog.Int("retired_version", old.Version), slog.Any("error", err))
	}
}

// dropTables drops the tables of version of p's projection, a version this runner has no
// definition of, or one without a DeleteFunc: the versioned tables of the stable names
// recorded for it (Backend.DropRetiredTables).
func (r *Runner) dropTables(ctx context.Context, p *Projection, version int) error {
	if err := r.backend.DropRetiredTables(ctx, p, version); err != nil {
		return fmt.Errorf("projection %s: drop the tables of the retired version %d: %w", p.base, version, err)
	}
	r.logger.InfoContext(ctx, "projection: retired version's tables dropped", slog.String("projection", p.name),
		slog.Int("retired_version", version))
	return nil
}

// DropRetired runs the DeleteFunc of the projection called name (a unit name, see UnitName)
// now, if its version is retired, and records that its read model is gone: its status row
// stays, so its batches keep doing nothing. A version that is not retired is refused with an
// error matching ErrNotRetired. Runners call it by themselves once Config.RetireGrace has
// passed.
//
// A version without a DeleteFunc gets the versioned tables of the stable names recorded for
// it dropped instead (Config.Tables, or the table a newer version adopted from a version 1).
// name may also be a version this runner has no definition of (its code is gone), of a
// projection it runs another version of: then the versioned tables of the stable names
// recorded for that version (Config.Tables, or the tables a newer version adopted from a
// version 1) are dropped. The active version's runner does that by itself once its own
// RetireGrace has passed since that version was retired.
func (r *Runner) DropRetired(ctx context.Context, name string) error {
	p, err := r.Projection(name)
	if err != nil {
		if other, version, ok := r.versionOf(name); ok {
			return r.dropTables(ctx, other, version)
		}
		return err
	}
	if p.cfg.DeleteFunc == nil {
		// E.g. a version 1 that predates versions, whose table a newer version adopted.
		return r.dropTables(ctx, p, p.cfg.Version)
	}
	if err := r.backend.DropRetired(ctx, p, hook("delete", p, p.cfg.DeleteFunc)); err != nil {
		return fmt.Errorf("projection %s: drop the retired version %d: %w", name, p.cfg.Version, err)
	}
	r.logger.InfoContext(ctx, "projection: retired version's read model dropped", slog.String("projection", name),
		slog.Int("version", p.cfg.Version))
	return nil
}

// versionOf finds, for a unit name this runner has no definition of, a projection of this
// runner with the same base name, and the unit's version.
func (r *Runner) versionOf(unit string) (*Projection, int, bool) {
	for _, name := range r.names {
		p := r.projections[name]
		version := 0
		switch {
		case unit == p.base:
			version = 1
		case strings.HasPrefix(unit, p.base+".v"):
			n, err := strconv.Atoi(strings.TrimPrefix(unit, p.base+".v"))
			if err != nil || n < 2 || p.base+".v"+strconv.Itoa(n) != unit {
				continue
			}
			version = n
		default:
			continue
		}
		return p, version, true
	}
	return nil, 0, false
}
