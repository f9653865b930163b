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
		waits = append(waits, pc.next(behind(), took))
	}
	require.Equal(t, []time.Duration{10, 30, 40, 40, 40, 40, 40}, ms(waits), "up by 2×+1, then the ratio's bound")
	require.Equal(t, buildPauseMax, pc.next(behind(), time.Second), "one wait is at most buildPauseMax")
	stuck := behind()
	require.Equal(t, 40*time.Millisecond, pc.next(stuck, took))
	require.Equal(t, 20*time.Millisecond, pc.next(stuck, took), "an active version whose position does not move is not waited for")
	pc.next(behind(), took)
	waits = waits[:0]
	for range 10 {
		waits = append(waits, pc.next(level, took))
	}
	require.Equal(t, []time.Duration{20, 10, 5, 2, 1, 0, 0, 0, 0, 0}, ms(waits), "down by half, then none")
	require.Zero(t, pc.next(VersionInfo{State: VersionBuilding, ActiveState: StateFailing, ActiveLag: time.Hour}, took),
		"a failing active version does not hold the build back")
	off := pacer{target: -1}
	require.Zero(t, off.next(behind(), took))
}

func ms(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d / time.Millisecond
	}
	return out
}
