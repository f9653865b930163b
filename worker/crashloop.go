package worker

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nudgeworks/nudge/deadletter"
)

// startClear is whether a projection's crash-loop verdict was dealt with at this start.
type startClear struct {
	mu   sync.Mutex
	done bool
}

// clearCrashLoopOnStart lifts, once per start, the crash-loop verdict of the projection of
// handler name (a partition unit's: its projection's) when the start-up replay replays its dead
// letters — "replay after deploy" is on and some failed before New made the worker — as the
// replay's own trigger would. The replay's trigger is published once the handlers run, behind
// every trigger queued meanwhile: each of those would meet the verdict first and be
// dead-lettered into the record the replay just marked. So the handlers and the start-up replay
// call this before anything else, and the verdict is gone before the first catch-up.
//
// A projection without crash-loop detection (CrashLoopLimit 0, the default) has no verdict, so
// its triggers never wait on the dead-letter store here.
//
// A dead-letter store it cannot read (partitioned away) does not hold the projection back: it
// gives up for this start after DeadLetterTimeout, with a warning, and the replay's trigger
// clears the verdict as before. A verdict it cannot clear is returned: the trigger is nacked
// and comes back, and the next call tries again.
func (w *Worker) clearCrashLoopOnStart(ctx context.Context, name string) error {
	if w.cfg.DisableReplayOnStart {
		return nil
	}
	name = cmp.Or(w.partitionOf[name], name)
	if !w.detectsCrashLoops(name) {
		return nil // no verdict to clear, and no reason to ask the dead-letter store
	}
	v, _ := w.startClears.LoadOrStore(name, &startClear{})
	c := v.(*startClear) //nolint:forcetypeassert // the map holds nothing else
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return nil
	}
	listCtx, cancel := context.WithTimeout(ctx, w.cfg.DeadLetterTimeout)
	defer cancel()
	targets, err := deadletter.ReplayTargets(listCtx, w.cfg.DeadLetters, deadletter.ReplayFilter{Projection: name, FailedBefore: w.created})
	if err != nil {
		if ctx.Err() == nil {
			c.done = true
			w.logger.WarnContext(ctx, "could not read the dead letters the start-up replay replays; a crash-loop verdict waits for the replay's trigger",
				slog.String("projection", name), slog.Any("error", err))
		}
		return nil
	}
	if len(targets) > 0 {
		if err := w.cfg.Runner.ClearCrashLoop(ctx, name); err != nil {
			return fmt.Errorf("projection %s: clear the crash-loop verdict for the start-up replay: %w", name, err)
		}
	}
	c.done = true
	return nil
}

// detectsCrashLoops reports whether projection name has crash-loop detection on
// (projection.Config.CrashLoopLimit), so that it can hold a verdict.
func (w *Worker) detectsCrashLoops(name string) bool {
	p, err := w.cfg.Runner.Projection(name)
	return err != nil || p.Config().CrashLoopLimit > 0 // unknown: ask, as before
}
