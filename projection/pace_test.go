package projection

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
)

// TestPacerBacksOffAndRecovers: the wait after a batch grows (2×+1 the batch's duration) while
// the active version lags over the target, bounded by the ratio and by buildPauseMax, and
// shrinks by half per batch once it does not, down to none.
func TestPacerBacksOffAndRecovers(t *testing.T) {
	pc := pacer{target: 10 * time.Millisecond}
	var at uint64
	behind := func() VersionInfo { // the active version works (its position moves), but lags
		at++
		return VersionInfo{State: VersionBuilding, ActiveState: StateRunning, ActiveLag: 50 * time.Millisecond,
			ActivePosition: eventstore.Position{TransactionID: at}}
	}
	level := VersionInfo{State: VersionBuilding, ActiveState: StateRunning, ActiveLag: 2 * time.Millisecond}
	took := 10 * time.Millisecond
	var waits []time.Duration
	for range 7 {
		waits = append(waits, pc.next(behind(), took, eventstore.Position{}, t0))
	}
	require.Equal(t, []time.Duration{10, 30, 40, 40, 40, 40, 40}, ms(waits), "up by 2×+1, then the ratio's bound")
	require.Equal(t, buildPauseMax, pc.next(behind(), time.Second, eventstore.Position{}, t0), "one wait is at most buildPauseMax")
	stuck := behind()
	require.Equal(t, 40*time.Millisecond, pc.next(stuck, took, eventstore.Position{}, t0))
	require.Equal(t, 20*time.Millisecond, pc.next(stuck, took, eventstore.Position{}, t0), "an active version whose position does not move is not waited for")
	pc.next(behind(), took, eventstore.Position{}, t0)
	waits = waits[:0]
	for range 10 {
		waits = append(waits, pc.next(level, took, eventstore.Position{}, t0))
	}
	require.Equal(t, []time.Duration{20, 10, 5, 2, 1, 0, 0, 0, 0, 0}, ms(waits), "down by half, then none")
	require.Zero(t, pc.next(VersionInfo{State: VersionBuilding, ActiveState: StateFailing, ActiveLag: time.Hour}, took, eventstore.Position{}, t0),
		"a failing active version does not hold the build back")
	off := pacer{target: -1}
	require.Zero(t, off.next(behind(), took, eventstore.Position{}, t0))
}

// t0 is the pacer tests' clock when the gain window plays no part.
var t0 = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)

// TestPacerRunsUnpacedWhenNotGaining: a build paced by a live lag that stays over the target
// keeps waiting as long as it gains on the active version; a gain window (buildGainWindow) in
// which it did not gain makes it run unpaced through the next window, and it is paced again
// once a window shows it gaining.
func TestPacerRunsUnpacedWhenNotGaining(t *testing.T) {
	pc := pacer{target: 10 * time.Millisecond}
	now, active := t0, int64(1_000_000)
	took := 10 * time.Millisecond
	// step: 100 ms later the active version is 100 events further and the build built gain
	// events more than that.
	step := func(build *int64, gain int64) time.Duration {
		now, active = now.Add(100*time.Millisecond), active+100
		*build += 100 + gain
		return pc.next(VersionInfo{State: VersionBuilding, ActiveState: StateRunning, ActiveLag: 50 * time.Millisecond,
			ActivePosition: eventstore.Position{TransactionID: uint64(active), GlobalPosition: active}}, took, eventstore.Position{GlobalPosition: *build}, now)
	}
	// The windows start at steps 1, 51, 101, 151 and 201 (50 steps of 100 ms each).
	build := int64(0)
	for i := 1; i <= 100; i++ { // gaining through the first window, then not through the second
		gain := int64(50)
		if i > 50 {
			gain = 0
		}
		require.Positive(t, step(&build, gain), "step %d: paced while the window before showed a gain", i)
	}
	for i := 101; i <= 200; i++ { // no gain in the second window: unpaced, and the third: again
		require.Zero(t, step(&build, 0), "step %d: a build that did not gain runs unpaced", i)
	}
	require.Positive(t, step(&build, 50), "step 201: the window ends with a gain: paced again")
}

func ms(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d / time.Millisecond
	}
	return out
}
