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
	pc := pacer{target: 10 * time.Millisecond, batchSize: 500}
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
		waits = append(waits, pc.next(behind(), 500, took, eventstore.Position{}, t0))
	}
	require.Equal(t, []time.Duration{10, 30, 70, 80, 80, 80, 80}, ms(waits), "up by 2×+1, then the ratio's bound (8)")
	require.Equal(t, buildPauseMax, pc.next(behind(), 500, 200*time.Millisecond, eventstore.Position{}, t0), "one wait is at most buildPauseMax")
	stuck := behind()
	require.Equal(t, 80*time.Millisecond, pc.next(stuck, 500, took, eventstore.Position{}, t0))
	require.Equal(t, 80*time.Millisecond, pc.next(stuck, 500, took, eventstore.Position{}, t0.Add(buildIdleAfter-time.Millisecond)),
		"an active version whose position has not moved for a while is still waited for")
	require.Equal(t, 72*time.Millisecond, pc.next(stuck, 500, took, eventstore.Position{}, t0.Add(buildIdleAfter)),
		"one whose position has not moved for buildIdleAfter is not")
	pc.next(behind(), 500, took, eventstore.Position{}, t0)
	waits = waits[:0]
	for range 64 {
		waits = append(waits, pc.next(level, 500, took, eventstore.Position{}, t0))
	}
	require.Equal(t, []time.Duration{72, 64, 58}, ms(waits[:3]), "down by a tenth per batch")
	require.Positive(t, waits[45], "a few dozen batches")
	require.Equal(t, make([]time.Duration, 18), waits[46:], "then none")
	require.Zero(t, pc.next(VersionInfo{State: VersionBuilding, ActiveState: StateFailing, ActiveLag: time.Hour}, 500, took, eventstore.Position{}, t0),
		"a failing active version does not hold the build back")
	off := pacer{target: -1}
	require.Zero(t, off.next(behind(), 500, took, eventstore.Position{}, t0))
}

// t0 is the pacer tests' clock when the gain window plays no part.
var t0 = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)

// TestPacerGivesWayWhenNotGaining: a build paced by a live lag that stays over the target
// waits up to buildPauseRatioMax times its batches as long as it gains on the active version
// (closes at least as much of its distance as the active version moves: it runs at least
// twice as fast as the live events arrive); each gain window (buildGainWindow) in which it did
// not gain that much halves that bound, down to none (unpaced, in whole batches), and each
// window with a gain doubles it back.
func TestPacerGivesWayWhenNotGaining(t *testing.T) {
	pc := pacer{target: 10 * time.Millisecond, batchSize: 500}
	now, active := t0, int64(1_000_000)
	took := 10 * time.Millisecond
	build := int64(0)
	// step: 100 ms later the active version is 100 events further and the build built gain
	// events more than that; the windows start every 50 steps (5 s).
	step := func(gain int64) time.Duration {
		now, active = now.Add(100*time.Millisecond), active+100
		build += 100 + gain
		return pc.next(VersionInfo{State: VersionBuilding, ActiveState: StateRunning, ActiveLag: 50 * time.Millisecond,
			ActivePosition: eventstore.Position{TransactionID: uint64(active), GlobalPosition: active}}, 10, took, eventstore.Position{GlobalPosition: build}, now)
	}
	window := func(gain int64) time.Duration { // the longest wait of a window's 50 steps
		var longest time.Duration
		for range 50 {
			longest = max(longest, step(gain))
		}
		return longest
	}
	require.Equal(t, 80*time.Millisecond, window(150), "the first window: 2.5 times the live rate, gaining, the whole bound")
	require.Equal(t, 80*time.Millisecond, window(150), "still gaining: the whole bound")
	require.Equal(t, buildBatchMin, pc.batchLimit(), "paced: batches sized to the budget")
	var longest []time.Duration
	for range 7 { // 1.5 times the live rate from here on: it gains, but less than the live events arrive
		longest = append(longest, window(50))
	}
	require.Equal(t, []time.Duration{80, 40, 20, 10, 0, 0, 0}, ms(longest),
		"each window that gained less than the active version moved halves the bound (the first one is judged as the second starts), to unpaced")
	require.Equal(t, 500, pc.batchLimit(), "unpaced for not gaining: whole batches")
	longest = longest[:0]
	for range 3 { // no gain at all: still unpaced
		longest = append(longest, window(0))
	}
	require.Equal(t, []time.Duration{0, 0, 0}, ms(longest), "not gaining at all: unpaced")
	longest = longest[:0]
	for range 4 {
		longest = append(longest, window(150))
	}
	require.Equal(t, []time.Duration{0, 10, 20, 40}, ms(longest), "gaining again: doubled back, window by window, from the window after the first that gained")
	require.Equal(t, buildBatchMin, pc.batchLimit(), "paced again: batches sized again")
}

// TestPacerSizesTheBatches: while the active version takes live events, a paced build's next
// batch reads as many events as take the lag target over buildBatchBudgetShare at the last
// batch's rate, at most twice the last batch and at least buildBatchMin; once the active
// version's position has not moved for buildIdleAfter the batches double back to the
// projection's BatchSize; unpaced builds and builds beside an active version that does not
// run read whole batches.
func TestPacerSizesTheBatches(t *testing.T) {
	pc := pacer{target: 10 * time.Millisecond, batchSize: 500}
	now, at := t0, uint64(0)
	live := func() VersionInfo { // the active version takes live events (its position moves)
		at++
		return VersionInfo{State: VersionBuilding, ActiveState: StateRunning, ActiveLag: 2 * time.Millisecond,
			ActivePosition: eventstore.Position{TransactionID: at}}
	}
	require.Equal(t, 500, pc.batchLimit(), "the first batch is a whole one")
	pc.next(live(), 500, 20*time.Millisecond, eventstore.Position{}, now)
	require.Equal(t, 125, pc.batchLimit(), "500 events in 20 ms: 125 take the budget, 5 ms")
	pc.next(live(), 125, 10*time.Millisecond, eventstore.Position{}, now)
	require.Equal(t, 62, pc.batchLimit(), "a batch's fixed cost shrinks the next one further")
	pc.next(live(), 62, time.Millisecond, eventstore.Position{}, now)
	require.Equal(t, 124, pc.batchLimit(), "at most double the last batch")
	pc.next(live(), 124, time.Second, eventstore.Position{}, now)
	require.Equal(t, buildBatchMin, pc.batchLimit(), "never under buildBatchMin")

	quiet := live() // the active version's position stays here from now on
	var limits []int
	for range 8 {
		now = now.Add(buildIdleAfter / 2)
		pc.next(quiet, pc.batchLimit(), time.Second, eventstore.Position{}, now)
		limits = append(limits, pc.batchLimit())
	}
	require.Equal(t, []int{10, 10, 20, 40, 80, 160, 320, 500}, limits,
		"kept while the active version moved within buildIdleAfter, then doubled back to BatchSize")

	pc.next(live(), 500, 20*time.Millisecond, eventstore.Position{}, now)
	require.Equal(t, 125, pc.batchLimit(), "sized again as soon as the active version moves")
	pc.next(VersionInfo{State: VersionBuilding, ActiveState: StatePaused}, 125, time.Second, eventstore.Position{}, now)
	require.Equal(t, 500, pc.batchLimit(), "an active version that does not run takes no live events")
	off := pacer{target: -1, batchSize: 500}
	off.next(live(), 500, time.Second, eventstore.Position{}, now)
	require.Equal(t, 500, off.batchLimit(), "an unpaced build reads whole batches")
}

func ms(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d / time.Millisecond
	}
	return out
}
