package worker_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
)

// subscriptionFault is what faultyChannel does to the first subscription of each unit.
type subscriptionFault int

const (
	subscriberRefused subscriptionFault = iota // Channel.Subscriber fails
	subscribeRefused                           // the subscriber's Subscribe fails
	subscriptionEnds                           // the subscription's messages end at once, as when its connection is lost
)

// faultyChannel injects fault into the first subscription of each partition unit it makes a
// subscriber for, and counts per unit the subscriptions that work.
type faultyChannel struct {
	channel.Channel
	fault subscriptionFault
	// partitionsOf names the partitioned projection whose partitions' units get the fault
	// (the router's subscription of the projection itself does not).
	partitionsOf string

	mu      sync.Mutex
	faulted map[string]bool
	healthy map[string]int
}

func (c *faultyChannel) Subscriber(unit string) (message.Subscriber, string, error) {
	sub, topic, err := c.Channel.Subscriber(unit)
	if err != nil {
		return nil, "", err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !strings.HasPrefix(unit, c.partitionsOf+"."):
		return sub, topic, nil
	case c.faulted[unit]:
		return &countedSubscriber{Subscriber: sub, c: c, unit: unit}, topic, nil
	}
	c.faulted[unit] = true
	if c.fault == subscriberRefused {
		_ = sub.Close()
		return nil, "", errors.New("make a subscriber: connection refused (injected)")
	}
	return &faultySubscriber{Subscriber: sub, fault: c.fault}, topic, nil
}

// healthyUnits returns how many units have had a working subscription.
func (c *faultyChannel) healthyUnits() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.healthy)
}

// faultySubscriber's subscriptions fail, or end at once.
type faultySubscriber struct {
	message.Subscriber
	fault subscriptionFault
}

func (s *faultySubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.fault == subscribeRefused {
		return nil, errors.New("subscribe: channel closed (injected)")
	}
	ended := make(chan *message.Message)
	close(ended)
	return ended, nil
}

// countedSubscriber counts its subscriptions as working.
type countedSubscriber struct {
	message.Subscriber
	c    *faultyChannel
	unit string
}

func (s *countedSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	msgs, err := s.Subscriber.Subscribe(ctx, topic)
	if err == nil {
		s.c.mu.Lock()
		s.c.healthy[s.unit]++
		s.c.mu.Unlock()
	}
	return msgs, err
}

// TestPartitionSubscriptionRetried: the first subscription of each partition fails — its
// subscriber cannot be made, its Subscribe is refused, or it ends at once as when a broker
// connection is lost under it — and the safety net is off. The worker still owns the
// partitions, subscribes again with backoff and consumes their triggers: events appended once
// every partition has a working subscription are applied through their triggers, once each.
func TestPartitionSubscriptionRetried(t *testing.T) {
	t.Parallel()
	for name, fault := range map[string]subscriptionFault{
		"subscriber refused": subscriberRefused,
		"subscribe refused":  subscribeRefused,
		"subscription ends":  subscriptionEnds,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t)
			ch := &faultyChannel{Channel: s.newChannel(t, channels["gochannel"]), fault: fault, partitionsOf: "resubscribed",
				faulted: map[string]bool{}, healthy: map[string]int{}}
			const parts, streams = 2, 10
			p := s.streamModel(t, "resubscribed", parts, nil)
			s.start(t, ch, s.leased("w1"), p)
			require.Eventually(t, func() bool { return ch.healthyUnits() == parts }, eventually, 10*time.Millisecond,
				"every partition subscribed again after its first subscription failed")
			s.appendStreams(t, streams, 0)
			require.Eventually(t, func() bool {
				rows, _ := s.streamRows(t, "resubscribed")
				return rows == streams
			}, eventually, 10*time.Millisecond, "the partitions' triggers consumed")
			rows, twice := s.streamRows(t, "resubscribed")
			require.Equal(t, streams, rows)
			require.Zero(t, twice, "each event applied once")
		})
	}
}
