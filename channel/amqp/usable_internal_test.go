package amqp

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// TestUsableIsOrderedWithClose: a publish's error path asks whether the connection is up
// (usable) while another goroutine closes the channel. watermill-amqp v2.1.3 replaces its
// "connected" channel unsynchronised once Close closes the connection, so usable must read it
// only in an order the race detector can see with Close: under c.mu, which Close takes before
// it closes the connection. A reader asks in a loop from before Close until it sees the
// channel closed, so its reads overlap Close; under -race the unordered read was reported
// (TestRouterLogsNameTheProjection and TestTicketScenarioParked in make test, once).
func TestUsableIsOrderedWithClose(t *testing.T) {
	t.Parallel()
	env := amqptest.New(t)
	for range 5 {
		c, err := New(context.Background(), Config{URL: env.URL, Prefix: env.Prefix, ConnectionName: env.ConnectionName,
			Logger: slog.New(slog.DiscardHandler), StartupTimeout: testwait.For(time.Minute)})
		require.NoError(t, err)
		var asked atomic.Int64
		done := make(chan error)
		go func() {
			for {
				err := c.usable() // what brokerError asks on a failed publish
				if err != nil {
					done <- err
					return
				}
				asked.Add(1)
			}
		}()
		require.Eventually(t, func() bool { return asked.Load() > 0 }, testwait.For(10*time.Second), time.Millisecond,
			"the reader found the connection up")
		require.NoError(t, c.Close())
		require.ErrorIs(t, <-done, ErrClosed, "the reader saw the channel closed, not a lost connection")
	}
}
