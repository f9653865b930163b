package worker

import (
	"cmp"
	"context"
	"fmt"
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
// call this before anything else, and the verdict is gone before the first catch-up. A failure
// is returned (the trigger is nacked and comes back); the next call tries again.
func (w *Worker) clearCrashLoopOnStart(ctx context.Context, name string) error {
	if w.cfg.DisableReplayOnStart {
		return nil
	}
	name = cmp.Or(w.partitionOf[name], name)
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
		return fmt.Errorf("worker: projection %s: read the dead letters the start-up replay replays: %w", name, err)
	}
	if len(targets) > 0 {
		if err := w.cfg.Runner.ClearCrashLoop(ctx, name); err != nil {
			return fmt.Errorf("projection %s: clear the crash-loop verdict for the start-up replay: %w", name, err)
		}
	}
	c.done = true
	return nil
}
