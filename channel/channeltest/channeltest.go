// Package channeltest is the suite every channel.Channel passes.
package channeltest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/trigger"
)

// wait is how long the suite waits for a message before it fails: an upper bound for a
// failure on a busy machine, not the time delivery takes.
var wait = testwait.For(time.Minute)

// NewChannelFunc returns a new channel for one subtest, isolated from other subtests (its own
// database, vhost or topic prefix), and, for a durable channel, the RestartFunc that restarts
// it (nil for a channel that keeps nothing). The suite closes the channel.
type NewChannelFunc func(t *testing.T) (channel.Channel, RestartFunc)

// RestartFunc ends old as a crash or an outage would (its broker connections closed, its pool
// gone) and returns a new channel on the same state: the same database, or vhost and prefix.
// The suite closes both channels.
type RestartFunc func(t *testing.T, old channel.Channel) channel.Channel

// Run runs the suite. Subtests run in parallel.
func Run(t *testing.T, newChannel NewChannelFunc) {
	tests := []struct {
		name string
		run  func(t *testing.T, ch channel.Channel)
	}{
		{"FanOutToEveryProjection", testFanOut},
		{"AddressedToOneProjection", testAddressed},
		{"AddressedToUndeclaredIsRefused", testAddressedUndeclared},
		{"NackRedelivers", testNack},
		{"DurableBeforeConsumerStarts", testDurable},
		{"ManyTriggers", testMany},
		{"RefusesInvalidNames", testInvalidNames},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ch, _ := newChannel(t)
			t.Cleanup(func() { require.NoError(t, ch.Close()) })
			tc.run(t, ch)
		})
	}
	t.Run("DurableAcrossRestart", func(t *testing.T) {
		t.Parallel()
		ch, restart := newChannel(t)
		t.Cleanup(func() { require.NoError(t, ch.Close()) })
		testRestart(t, ch, restart)
	})
}

// Consume subscribes to the projection's subscription and returns its messages; the
// subscription ends with the test.
func Consume(t testing.TB, ch channel.Channel, projectionName string) <-chan *message.Message {
	t.Helper()
	sub, topic, err := ch.Subscriber(projectionName)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	return msgs
}

// Next waits for the next message, acks it and decodes its trigger.
func Next(t testing.TB, msgs <-chan *message.Message) trigger.Trigger {
	t.Helper()
	msg, tr := Receive(t, msgs)
	msg.Ack()
	return tr
}

// Receive waits for the next message and decodes its trigger, without acking it.
func Receive(t testing.TB, msgs <-chan *message.Message) (*message.Message, trigger.Trigger) {
	t.Helper()
	select {
	case msg := <-msgs:
		require.NotNil(t, msg)
		tr, err := trigger.FromMessage(msg)
		require.NoError(t, err)
		return msg, tr
	case <-time.After(wait):
		t.Fatalf("no trigger arrived within %s", wait)
		return nil, trigger.Trigger{}
	}
}

// Trigger returns an append trigger at global position n.
func Trigger(n int64) trigger.Trigger {
	return trigger.Trigger{
		Position: eventstore.Position{TransactionID: uint64(1000 + n), GlobalPosition: n},
		StreamID: fmt.Sprintf("stream-%d", n), Types: []string{"A"},
		At: time.Now().UTC().Truncate(time.Microsecond), Reason: trigger.ReasonAppend,
	}
}

func declare(t testing.TB, ch channel.Channel, names ...string) {
	t.Helper()
	require.NoError(t, ch.Declare(context.Background(), names...))
}

func testFanOut(t *testing.T, ch channel.Channel) {
	declare(t, ch, "alpha", "beta.v2")
	declare(t, ch, "alpha", "beta.v2") // idempotent
	a, b := Consume(t, ch, "alpha"), Consume(t, ch, "beta.v2")
	want := Trigger(1)
	require.NoError(t, ch.Publish(context.Background(), want))
	for _, msgs := range []<-chan *message.Message{a, b} {
		got := Next(t, msgs)
		require.Equal(t, want.Position, got.Position)
		require.Equal(t, want.StreamID, got.StreamID)
		require.Equal(t, want.Types, got.Types)
		require.True(t, want.At.Equal(got.At))
	}
}

func testAddressed(t *testing.T, ch channel.Channel) {
	declare(t, ch, "alpha", "beta")
	a, b := Consume(t, ch, "alpha"), Consume(t, ch, "beta")
	only := Trigger(2)
	only.Projection, only.Reason = "beta", trigger.ReasonReplay
	require.NoError(t, ch.Publish(context.Background(), only))
	got := Next(t, b)
	require.Equal(t, "beta", got.Projection)
	require.Equal(t, trigger.ReasonReplay, got.Reason)

	// A broadcast marker published after the addressed trigger: each subscription delivers in
	// order, so whatever alpha received of the addressed trigger comes before the marker.
	require.NoError(t, ch.Publish(context.Background(), Trigger(3)))
	require.Equal(t, int64(3), Next(t, b).Position.GlobalPosition, "beta gets the marker after its trigger")
	if ch.Durable() {
		got := Next(t, a)
		require.Empty(t, got.Projection, "alpha received the trigger addressed to beta")
		require.Equal(t, int64(3), got.Position.GlobalPosition, "alpha's first trigger is the marker")
		return
	}
	// A channel that cannot address one subscription may deliver the addressed trigger to
	// alpha too (its consumer ignores it), but nothing else.
	tr := Next(t, a)
	if tr.Projection != "" {
		require.Equal(t, "beta", tr.Projection)
		require.Equal(t, int64(2), tr.Position.GlobalPosition)
		tr = Next(t, a)
	}
	require.Empty(t, tr.Projection)
	require.Equal(t, int64(3), tr.Position.GlobalPosition, "alpha's next trigger is the marker")
}

// testAddressedUndeclared: on a durable channel, a trigger addressed to a projection nobody
// declared is refused and leaves nothing behind: the projection's first trigger after it
// declares is the one published then.
func testAddressedUndeclared(t *testing.T, ch channel.Channel) {
	if !ch.Durable() {
		t.Log("this channel keeps nothing for absent consumers: nothing to check")
		return
	}
	declare(t, ch, "alpha")
	lost := Trigger(8)
	lost.Projection, lost.Reason = "gamma", trigger.ReasonReplay
	require.Error(t, ch.Publish(context.Background(), lost), "gamma was never declared")

	declare(t, ch, "gamma")
	require.NoError(t, ch.Publish(context.Background(), Trigger(9)))
	require.Equal(t, int64(9), Next(t, Consume(t, ch, "gamma")).Position.GlobalPosition,
		"the refused trigger was not kept for gamma")
}

func testNack(t *testing.T, ch channel.Channel) {
	declare(t, ch, "alpha")
	msgs := Consume(t, ch, "alpha")
	require.NoError(t, ch.Publish(context.Background(), Trigger(4)))
	select {
	case msg := <-msgs:
		msg.Nack()
	case <-time.After(wait):
		t.Fatal("no trigger arrived")
	}
	require.Equal(t, int64(4), Next(t, msgs).Position.GlobalPosition, "a nacked trigger comes back")
}

func testDurable(t *testing.T, ch channel.Channel) {
	if !ch.Durable() {
		t.Log("this channel keeps nothing for consumers that have not started: nothing to check")
		return
	}
	declare(t, ch, "alpha", "beta")
	require.NoError(t, ch.Publish(context.Background(), Trigger(5)))
	require.Equal(t, int64(5), Next(t, Consume(t, ch, "alpha")).Position.GlobalPosition)
	require.Equal(t, int64(5), Next(t, Consume(t, ch, "beta")).Position.GlobalPosition)
}

// testRestart: triggers published before a restart (the publisher's connections closed, a new
// channel opened on the same state, no consumer running in between) reach every declared
// subscription after it, and the new channel publishes to them without declaring again.
func testRestart(t *testing.T, ch channel.Channel, restart RestartFunc) {
	if !ch.Durable() {
		t.Log("this channel keeps nothing across a restart: nothing to check")
		return
	}
	require.NotNil(t, restart, "a durable channel's suite needs a RestartFunc")
	declare(t, ch, "alpha", "beta")
	require.NoError(t, ch.Publish(context.Background(), Trigger(6)))

	re := restart(t, ch)
	t.Cleanup(func() { require.NoError(t, re.Close()) })
	a, b := Consume(t, re, "alpha"), Consume(t, re, "beta")
	require.Equal(t, int64(6), Next(t, a).Position.GlobalPosition, "alpha's trigger survived the restart")
	require.Equal(t, int64(6), Next(t, b).Position.GlobalPosition, "beta's trigger survived the restart")
	require.NoError(t, re.Publish(context.Background(), Trigger(7)))
	require.Equal(t, int64(7), Next(t, a).Position.GlobalPosition)
	require.Equal(t, int64(7), Next(t, b).Position.GlobalPosition)
}

func testMany(t *testing.T, ch channel.Channel) {
	declare(t, ch, "alpha", "beta")
	a, b := Consume(t, ch, "alpha"), Consume(t, ch, "beta")
	const n = 200
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 4 {
				if err := ch.Publish(context.Background(), Trigger(int64(100+i))); err != nil {
					t.Errorf("publish: %v", err)
					return
				}
			}
		}()
	}
	for _, msgs := range []<-chan *message.Message{a, b} {
		seen := map[int64]bool{}
		for len(seen) < n {
			seen[Next(t, msgs).Position.GlobalPosition] = true
		}
	}
	wg.Wait()
}

func testInvalidNames(t *testing.T, ch channel.Channel) {
	for _, bad := range []string{"", "Bad", "x; DROP TABLE y", "a b", "amq.gen#"} {
		require.ErrorIs(t, ch.Declare(context.Background(), bad), name.ErrInvalid, bad)
		_, _, err := ch.Subscriber(bad)
		require.ErrorIs(t, err, name.ErrInvalid, bad)
	}
	bad := Trigger(1)
	bad.Projection = "x'y"
	require.ErrorIs(t, ch.Publish(context.Background(), bad), name.ErrInvalid)
}
