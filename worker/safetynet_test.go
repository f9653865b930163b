package worker_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/worker"
)

// TestSafetyNetLeavesIdleProjectionsAlone: a projection with nothing to read is caught up at
// every tenth safety-net tick only, not at each, and events whose triggers were all lost are
// still caught up by the ticks.
func TestSafetyNetLeavesIdleProjectionsAlone(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ch := &droppingChannel{Channel: s.newChannel(t, channels["gochannel"])}
	var ticks atomic.Int64
	cfg := worker.WithSafetyNetTickFunc(worker.Config{SafetyNetInterval: 5 * time.Millisecond}, func(n int) { ticks.Store(int64(n)) })
	w := s.start(t, ch, cfg, s.model(t, "alpha", nil))

	// The start-up catch-up, then one per ten ticks at most: never one per tick.
	require.Eventually(t, func() bool { return ticks.Load() >= 35 }, eventually, time.Millisecond)
	catchUps := w.Stats("alpha").CatchUps
	require.LessOrEqual(t, catchUps, 1+ticks.Load()/10, "an idle projection is caught up at every tenth tick only")
	require.Eventually(t, func() bool { return w.Stats("alpha").CatchUps >= 2 }, eventually, time.Millisecond,
		"every tenth tick catches the idle projection up all the same")

	// Lost triggers: the ticks see the events waiting and catch up.
	for n := range 5 {
		_, err := s.store.Append(context.Background(), "s", eventstore.Any, storeEvent(n))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { rows, _ := s.count(t, "alpha"); return rows == 5 }, eventually, 5*time.Millisecond)
	require.Zero(t, w.Stats("alpha").Received, "no trigger arrived: the safety net caught up")
}
