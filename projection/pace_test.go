package projection

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
)

// TestPacerBacksOffAndRecovers: the wait after a batch grows (2×+1 the batch's duration) while
// the active version lags over the target, bounded by the ratio and by buildPauseMax, and
// comes down by a tenth per batch once it does not, down to none.
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
	require.Equal(t, []time.Duration{10, 30, 70, 150, 310, 320, 320}, ms(waits), "up by 2×+1, then the ratio's bound (32)")
	require.Equal(t, buildPauseMax, pc.next(behind(), 100*time.Millisecond, eventstore.Position{}, t0), "one wait is at most buildPauseMax")
	stuck := behind()
	require.Equal(t, 320*time.Millisecond, pc.next(stuck, took, eventstore.Position{}, t0))
	require.Equal(t, 288*time.Millisecond, pc.next(stuck, took, eventstore.Position{}, t0), "an active version whose position does not move is not waited for")
	pc.next(behind(), took, eventstore.Position{}, t0)
	waits = waits[:0]
	for range 64 {
		waits = append(waits, pc.next(level, took, eventstore.Position{}, t0))
	}
	require.Equal(t, []time.Duration{288, 259, 233}, ms(waits[:3]), "down by a tenth per batch")
	require.Positive(t, waits[58], "a few dozen batches")
	require.Equal(t, make([]time.Duration, 5), waits[59:], "then none")
	require.Zero(t, pc.next(VersionInfo{State: VersionBuilding, ActiveState: StateFailing, ActiveLag: time.Hour}, took, eventstore.Position{}, t0),
		"a failing active version does not hold the build back")
	off := pacer{target: -1}
	require.Zero(t, off.next(behind(), took, eventstore.Position{}, t0))
}

// t0 is the pacer tests' clock when the gain window plays no part.
var t0 = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)

// TestPacerGivesWayWhenNotGaining: a build paced by a live lag that stays over the target
// waits up to buildPauseRatioMax times its batches as long as it gains on the active version;
// each gain window (buildGainWindow) in which it did not gain halves that bound, down to none
// (unpaced), and each window with a gain doubles it back.
func TestPacerGivesWayWhenNotGaining(t *testing.T) {
	pc := pacer{target: 10 * time.Millisecond}
	now, active := t0, int64(1_000_000)
	took := 10 * time.Millisecond
	build := int64(0)
	// step: 100 ms later the active version is 100 events further and the build built gain
	// events more than that; the windows start every 50 steps (5 s).
	step := func(gain int64) time.Duration {
		now, active = now.Add(100*time.Millisecond), active+100
		build += 100 + gain
		return pc.next(VersionInfo{State: VersionBuilding, ActiveState: StateRunning, ActiveLag: 50 * time.Millisecond,
			ActivePosition: eventstore.Position{TransactionID: uint64(active), GlobalPosition: active}}, took, eventstore.Position{GlobalPosition: build}, now)
	}
	window := func(gain int64) time.Duration { // the longest wait of a window's 50 steps
		var longest time.Duration
		for range 50 {
			longest = max(longest, step(gain))
		}
		return longest
	}
	require.Equal(t, 320*time.Millisecond, window(50), "the first window: gaining, the whole bound")
	var longest []time.Duration
	for range 7 { // no gain at all from here on
		longest = append(longest, window(0))
	}
	require.Equal(t, []time.Duration{320, 160, 80, 40, 20, 10, 0}, ms(longest),
		"each window that did not gain halves the bound (the first one is judged as the second starts), to unpaced")
	longest = longest[:0]
	for range 4 {
		longest = append(longest, window(50))
	}
	require.Equal(t, []time.Duration{10, 20, 40, 80}, ms(longest), "gaining again (from the window's first step on): doubled back, window by window")
}

func ms(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d / time.Millisecond
	}
	return out
}
