package worker_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/trigger"
	"github.com/nudgeworks/nudge/worker"
)

// TestTriggerFuncSeesAppendTriggers: Config.TriggerFunc gets each append trigger a
// projection's handler decodes, named for the projection, made before it was received.
func TestTriggerFuncSeesAppendTriggers(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	var (
		mu  sync.Mutex
		got []worker.TriggerReport
	)
	s.start(t, goChannel(t), worker.Config{SafetyNetInterval: -1, TriggerFunc: func(r worker.TriggerReport) {
		mu.Lock()
		got = append(got, r)
		mu.Unlock()
	}}, s.model(t, "alpha", nil))
	s.append(t, "s-1", storeEvent(1))
	require.Eventually(t, func() bool { return s.has(t, "alpha", 1) }, eventually, 10*time.Millisecond)
	// The start-up catch-up may handle the event before its trigger arrives: wait for it.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0
	}, eventually, 10*time.Millisecond, "the event's trigger was reported")
	mu.Lock()
	defer mu.Unlock()
	for _, r := range got {
		require.Equal(t, "alpha", r.Projection)
		require.Equal(t, trigger.ReasonAppend, r.Trigger.Reason)
		require.False(t, r.Trigger.At.IsZero())
		require.False(t, r.Received.Before(r.Trigger.At), "received %s before made %s", r.Received, r.Trigger.At)
	}
}
