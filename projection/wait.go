package projection

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nudgeworks/nudge/internal/backoff"
)

// WaitCaughtUp waits until every named projection (all of the runner's when none is named) is
// caught up: its condition is ConditionCaughtUp — no readable event left, nothing held behind
// the horizon, not failing, paused or rebuilding — or retired: a version a newer one replaced
// has nothing left to do (its batches do nothing). It does not catch up itself: a worker must
// be running (a projection no worker has registered yet counts as not caught up). It polls the
// status, starting at 5 ms and backing off to 200 ms, and returns nil, or ctx's error with what
// each projection still waited for when ctx ends. Tests and examples use it instead of polling
// loops of their own.
func (r *Runner) WaitCaughtUp(ctx context.Context, names ...string) error {
	if len(names) == 0 {
		names = r.Names()
	}
	for _, name := range names {
		if _, err := r.Projection(name); err != nil {
			return err
		}
	}
	wait := backoff.Exponential{Initial: 5 * time.Millisecond, Max: 200 * time.Millisecond}
	for {
		pending, err := r.notCaughtUp(ctx, names)
		if err != nil {
			return err
		}
		if len(pending) == 0 && ctx.Err() == nil {
			return nil
		}
		if err := backoff.Sleep(ctx, wait.Next()); err != nil {
			return fmt.Errorf("projection: not caught up: %s: %w", strings.Join(pending, "; "), err)
		}
	}
}

// notCaughtUp says, for each of names that is not caught up, what it waits for. When ctx ends
// it returns what it has seen so far, without an error.
func (r *Runner) notCaughtUp(ctx context.Context, names []string) ([]string, error) {
	var pending []string
	for _, name := range names {
		st, err := r.Status(ctx, name)
		switch {
		case errors.Is(err, ErrNotRegistered):
			pending = append(pending, name+" not registered yet (no worker has started it)")
			continue
		case err != nil && ctx.Err() != nil:
			return pending, nil
		case err != nil:
			return nil, fmt.Errorf("projection %s: wait until caught up: %w", name, err)
		}
		if k := st.Condition(); k != ConditionCaughtUp && k != ConditionRetired {
			pending = append(pending, fmt.Sprintf("%s %s (position %s, lag %d)", name, k, st.Position, st.LagEvents))
		}
	}
	return pending, nil
}
