package worker_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	dlpg "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/worker"
)

// TestDeadLetterStoreRefusing: the dead-letter database refuses connections (its proxy is
// closed) while a projection fails on an event at once (no retries). The nacked trigger comes
// back — at once on RabbitMQ and GoChannel — and fails again, but not in a hot loop: every
// failed dead-letter write waits before its nack, so the attempts keep pace with those waits
// (which double, up to a cap; TestDeadLetterFailureWaits) rather than running into hundreds.
func TestDeadLetterStoreRefusing(t *testing.T) {
	eachChannel(t, func(t *testing.T, s *setup, ch channel.Channel) {
		pool, proxy := s.stalledPool(t)
		behind, err := dlpg.New(pool, dlpg.Config{})
		require.NoError(t, err)
		require.NoError(t, behind.Migrate(context.Background()))
		store := &watchedStore{Store: behind}
		var attempts atomic.Int64
		w := s.start(t, ch, worker.Config{
			SafetyNetInterval: -1,
			Retry:             retry.Policy{MaxAttempts: 1},
			DeadLetters:       store,
			DeadLetterTimeout: time.Minute,
		}, s.model(t, "alpha", func(n int) error {
			if n == 1 {
				attempts.Add(1)
				return errors.New("cannot project event 1")
			}
			return nil
		}))

		require.NoError(t, proxy.Close()) // the dead-letter database refuses connections from now on
		s.append(t, "s", storeEvent(1))
		require.Eventually(t, func() bool { return store.adds.Load() >= 5 }, eventually, 5*time.Millisecond,
			"the nacked trigger comes back and its dead letter is tried again")
		waits, adds, tried := worker.DeadLetterWaits(w, "alpha"), store.adds.Load(), attempts.Load()
		t.Logf("%d attempts, %d dead-letter writes, %d waits", tried, adds, waits)
		require.GreaterOrEqual(t, waits, adds-1, "every failed dead-letter write but the one in flight waited before its nack")
		require.LessOrEqual(t, tried, waits+2, "an attempt follows a wait (the first, and one in flight, excepted)")
		require.False(t, s.has(t, "alpha", 1))
	})
}
