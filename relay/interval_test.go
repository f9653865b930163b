package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/trigger"
)

// slowPublisher takes at least delay to publish, as a publish that waits for RabbitMQ's confirm
// under load does.
type slowPublisher struct {
	recordingPublisher
	delay time.Duration
}

func (p *slowPublisher) Publish(ctx context.Context, t trigger.Trigger) error {
	time.Sleep(p.delay)
	return p.recordingPublisher.Publish(ctx, t)
}

// TestRelayCountsThePublishTowardItsWait: the relay's wait after a publish is MinInterval less
// the time the publish took, so events appended while a publish waits for its confirm do not
// wait for MinInterval on top of it.
func TestRelayCountsThePublishTowardItsWait(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, store, backend := newBackend(t)
	res, err := store.Append(ctx, "ticket-1", eventstore.Any, eventstore.EventData{Type: "TicketWasRegistered", Payload: []byte(`{}`)})
	require.NoError(t, err)

	const delay = 50 * time.Millisecond
	pub := &slowPublisher{delay: delay}
	polls := make(chan projection.PollParams, 10)
	rl, err := relay.New(backend, pub, relay.Config{MinInterval: time.Second, MaxInterval: time.Second, Logger: testlog.New(t),
		AfterPollFunc: func(p projection.PollParams) { polls <- p }})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- rl.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	for {
		var p projection.PollParams
		select {
		case p = <-polls:
		case <-time.After(testwait.For(time.Minute)):
			t.Fatal("the relay never published the appended event")
		}
		require.NoError(t, p.Err)
		if p.Result.Events == 0 {
			continue // the event was not readable yet
		}
		got, n := pub.last()
		require.Equal(t, 1, n)
		require.Equal(t, res.Last(), got.Position)
		require.GreaterOrEqual(t, p.Next, time.Duration(0))
		require.LessOrEqual(t, p.Next, time.Second-delay, "the publish's %s count toward the wait after it", delay)
		return
	}
}
