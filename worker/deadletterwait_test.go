package worker_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/deadletter"
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

// addWatch reports the end of each Add of a dead-letter store, with its error.
type addWatch struct {
	deadletter.Store
	started atomic.Int64
	ended   chan error
}

func (a *addWatch) Add(ctx context.Context, e deadletter.Entry) (deadletter.Record, error) {
	a.started.Add(1)
	rec, err := a.Store.Add(ctx, e)
	a.ended <- err
	return rec, err
}

// TestShutdownCancelsDeadLetterWrite: a dead-letter write blocked on a partitioned database
// (DeadLetterTimeout an hour) ends with the worker: by the time Run has returned, the write has
// returned, cancelled by its context rather than timed out; the trigger is nacked, never acked.
// (pgx still closes the connection it interrupted in the background, for up to 15 s against a
// partitioned server, and the pool's Close waits for that: nudge.Client.ClosePools bounds it.)
func TestShutdownCancelsDeadLetterWrite(t *testing.T) {
	eachChannel(t, func(t *testing.T, s *setup, ch channel.Channel) {
		pool, proxy := s.stalledPool(t)
		behind, err := dlpg.New(pool, dlpg.Config{})
		require.NoError(t, err)
		require.NoError(t, behind.Migrate(context.Background()))
		store := &addWatch{Store: behind, ended: make(chan error, 100)}
		_, stop := s.startStoppable(t, ch, worker.Config{
			SafetyNetInterval: -1,
			Retry:             retry.Policy{MaxAttempts: 1},
			DeadLetters:       store,
			DeadLetterTimeout: time.Hour,
		}, s.model(t, "alpha", func(n int) error {
			if n == 1 {
				return errors.New("cannot project event 1")
			}
			return nil
		}))
		t.Cleanup(func() { require.NoError(t, ch.Close()) })

		proxy.Stall()
		s.append(t, "s", storeEvent(1))
		require.Eventually(t, func() bool { return store.started.Load() == 1 }, eventually, 5*time.Millisecond,
			"the trigger's dead letter is being written, blocked on the partition")
		stop()
		select {
		case err := <-store.ended:
			require.ErrorIs(t, err, context.Canceled, "the shutdown cancelled the write")
		default:
			t.Fatal("Run returned while a dead-letter write still held a connection")
		}
	})
}
