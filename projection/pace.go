package projection

import (
	"context"
	"time"

	"github.com/nudgeworks/nudge/eventstore"
)

const (
	// BuildLagTargetDefault is Config.BuildLagTarget's default: the active version's lag above
	// which a version built beside it slows down. It is about what a live event waits for its
	// batch when nothing else runs (a few ms to ~10 ms on a small machine), so the build yields
	// as soon as the live events queue behind its work; a higher target (it was 50 ms) was
	// reached only when the machine was loaded from outside, and a build on a quiet machine
	// then ran at full speed and raised the live tail by a fifth or more (`make bench`,
	// -scenario bluegreen).
	BuildLagTargetDefault = 10 * time.Millisecond
	// buildPauseMax bounds one wait of a paced build between two of its batches: however
	// loaded the active version, the build goes on, a batch at least this often.
	buildPauseMax = time.Second
	// buildPauseRatioMax bounds the wait of a paced build to this many times its last
	// batch's duration (the build then runs at least 1/(1+buildPauseRatioMax) of the time).
	buildPauseRatioMax = 4
	// buildPauseRatioMin: a ratio below it is none (full speed).
	buildPauseRatioMin = 1.0 / 16
	// buildGainWindow is how often a paced build checks that it gains on the active version:
	// one that did not over a window runs unpaced through the next.
	buildGainWindow = 5 * time.Second
)

// pacer paces a version built beside the active one by the active version's lag, batch by
// batch: after each batch of history it waits a multiple of the batch's duration. The
// multiple doubles (plus one) while the active version's lag, seen when the batch started, is
// over the target, and halves while it is not — additive-increase, multiplicative-decrease
// turned round, since the build yields: it backs off fast when the live projection falls
// behind and takes its speed back step by step once it keeps up.
//
// Only a live projection that is working is waited for: when the active version's position
// has not moved since the batch before (no worker runs it, or its batch is stuck) a wait
// would not bring its lag down, and the build goes on as if it were level.
//
// A paced build must still end: on a machine loaded from outside the live lag can stay over
// the target for good while the build, waiting up to buildPauseRatioMax times its batches,
// runs no faster than the live events arrive, and never catches up. So every buildGainWindow
// the pacer compares the build's distance to the active version's position (in the store's
// global positions) with the window before: a build that did not gain runs unpaced through
// the next window.
type pacer struct {
	target time.Duration
	ratio  float64
	// active is the active version's position the batch before saw; seen once one did.
	active eventstore.Position
	seen   bool
	// waited sums the waits, for the log.
	waited time.Duration
	// window is when the current gain window started and gap the build's distance to the
	// active version then; unpaced: the window before showed no gain.
	window  time.Time
	gap     int64
	unpaced bool
}

// next returns how long to wait after a batch of history that took took, saw ver and left the
// build at position at, now.
func (pc *pacer) next(ver VersionInfo, took time.Duration, at eventstore.Position, now time.Time) time.Duration {
	if pc.target < 0 || ver.ActiveState != StateRunning {
		pc.ratio = 0 // nothing to protect: an active version that does not run has no live lag to keep low
		return 0
	}
	if pc.starved(ver.ActivePosition.GlobalPosition-at.GlobalPosition, now) {
		pc.ratio = 0
		return 0
	}
	working := !pc.seen || pc.active.Less(ver.ActivePosition)
	pc.active, pc.seen = ver.ActivePosition, true
	if ver.ActiveLag > pc.target && working {
		pc.ratio = min(2*pc.ratio+1, buildPauseRatioMax)
	} else if pc.ratio /= 2; pc.ratio < buildPauseRatioMin {
		pc.ratio = 0
	}
	wait := min(time.Duration(pc.ratio*float64(took)), buildPauseMax)
	pc.waited += wait
	return wait
}

// starved reports whether the build runs unpaced: the gain window before the current one
// ended with the build (gap behind the active version now) no closer than it started.
func (pc *pacer) starved(gap int64, now time.Time) bool {
	switch {
	case pc.window.IsZero():
		pc.window, pc.gap = now, gap
	case now.Sub(pc.window) >= buildGainWindow:
		pc.unpaced = gap >= pc.gap
		pc.window, pc.gap = now, gap
	}
	return pc.unpaced
}

// sleep waits d, or until ctx ends.
func (r *Runner) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
