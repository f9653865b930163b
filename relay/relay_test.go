package relay_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	memstore "github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection/memory"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/trigger"
)

// recordingPublisher keeps what it was given; while down it fails.
type recordingPublisher struct {
	mu   sync.Mutex
	down bool
	got  []trigger.Trigger
}

func (p *recordingPublisher) Publish(_ context.Context, t trigger.Trigger) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		return errors.New("broker unreachable")
	}
	p.got = append(p.got, t)
	return nil
}

func (p *recordingPublisher) last() (trigger.Trigger, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.got) == 0 {
		return trigger.Trigger{}, 0
	}
	return p.got[len(p.got)-1], len(p.got)
}

func (p *recordingPublisher) setDown(down bool) {
	p.mu.Lock()
	p.down = down
	p.mu.Unlock()
}

// TestRelayCoalescesAndNeverLosesATrigger: the relay publishes one trigger for many appends,
// covering the last one; while publishing fails its position stays, and once the publisher is
// back the trigger goes out.
func TestRelayCoalescesAndNeverLosesATrigger(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	backend, err := memory.New(store, memory.Config{})
	require.NoError(t, err)
	pub := &recordingPublisher{down: true}
	rl, err := relay.New(backend, pub, relay.Config{MinInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond, Logger: testlog.New(t)})
	require.NoError(t, err)

	ctx := context.Background()
	var last eventstore.AppendResult
	for i := range 50 {
		typ := "Registered"
		if i%2 == 1 {
			typ = "Closed"
		}
		last, err = store.Append(ctx, "ticket", eventstore.Any, storetest.Event(typ, i))
		require.NoError(t, err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rl.Run(runCtx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	require.Eventually(t, func() bool {
		st, err := rl.Status(ctx)
		return err == nil && st.FailingEvent != nil
	}, testwait.For(time.Minute), time.Millisecond, "the failed publish is recorded")
	st, err := rl.Status(ctx)
	require.NoError(t, err)
	require.True(t, st.Position.IsZero(), "no position is committed while the trigger is not out")
	require.Contains(t, st.LastError, "broker unreachable")

	pub.setDown(false)
	require.Eventually(t, func() bool {
		got, _ := pub.last()
		return got.Position == last.Last()
	}, testwait.For(time.Minute), time.Millisecond)
	got, count := pub.last()
	require.Equal(t, 1, count, "50 appends, one trigger")
	require.Equal(t, []string{"Closed", "Registered"}, got.Types)
	require.Equal(t, "ticket", got.StreamID)
	require.Equal(t, []uint32{eventstore.PartitionKey("ticket")}, got.Keys, "one stream, one key")
	require.Equal(t, trigger.ReasonAppend, got.Reason)

	more, err := store.Append(ctx, "other", eventstore.Any, storetest.Event("Registered", 99))
	require.NoError(t, err)
	rl.Wake()
	require.Eventually(t, func() bool { got, _ := pub.last(); return got.Position == more.Last() }, testwait.For(time.Minute), time.Millisecond)
	got, _ = pub.last()
	require.Equal(t, "other", got.StreamID)
	require.Eventually(t, func() bool {
		st, err := rl.Status(ctx)
		return err == nil && st.CaughtUp() && st.FailingEvent == nil
	}, testwait.For(time.Minute), time.Millisecond)
}
