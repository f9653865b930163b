package worker_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/deadletter"
	dlpg "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/worker"
)

// resolveWatch counts the ResolvePassed calls of a dead-letter store, those in flight and the
// most in flight at once.
type resolveWatch struct {
	deadletter.Store
	calls, inFlight, maxInFlight atomic.Int64
}

func (r *resolveWatch) ResolvePassed(ctx context.Context, name string, pos eventstore.Position, at time.Time) (int, error) {
	r.calls.Add(1)
	n := r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	for m := r.maxInFlight.Load(); n > m && !r.maxInFlight.CompareAndSwap(m, n); m = r.maxInFlight.Load() {
	}
	return r.Store.ResolvePassed(ctx, name, pos, at)
}

// TestHealingOffTheTriggerPath: the dead-letter database is partitioned (a proxy that stalls)
// while a projection that never failed handles triggers. Resolving the dead letters it passed
// runs beside its catch-ups, not in them: while one resolve is blocked on the partition, the
// triggers of later appends are handled and their events projected; the catch-ups meanwhile
// coalesce into one pending resolve, and one resolve runs at a time. Once the partition heals,
// the blocked resolve and the pending one go through, and a transient dead letter whose event
// the projection passed is resolved as healed.
func TestHealingOffTheTriggerPath(t *testing.T) {
	eachChannel(t, func(t *testing.T, s *setup, ch channel.Channel) {
		ctx := context.Background()
		pool, proxy := s.stalledPool(t)
		direct, err := dlpg.New(s.db.Pool, dlpg.Config{}) // reads and writes around the proxy
		require.NoError(t, err)
		require.NoError(t, direct.Migrate(ctx))
		behind, err := dlpg.New(pool, dlpg.Config{})
		require.NoError(t, err)
		store := &resolveWatch{Store: behind}
		w := s.start(t, ch, worker.Config{SafetyNetInterval: -1, DeadLetters: store, DeadLetterTimeout: time.Hour},
			s.model(t, "alpha", nil))

		s.append(t, "s", storeEvent(1))
		require.Eventually(t, func() bool { return store.calls.Load() == 1 && store.inFlight.Load() == 0 }, eventually, 5*time.Millisecond,
			"the catch-up of event 1 has its passed dead letters resolved, the store answering")

		proxy.Stall()
		s.append(t, "s", storeEvent(2))
		require.Eventually(t, func() bool { return store.inFlight.Load() == 1 }, eventually, 5*time.Millisecond,
			"the catch-up of event 2 signals a resolve, which blocks on the partition")
		events, err := s.store.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{Limit: 10})
		require.NoError(t, err)
		require.Len(t, events, 2)
		ref := events[1].Ref()
		seeded, err := direct.Add(ctx, deadletter.Entry{Projection: "alpha", MessageUUID: "m-2", Error: "lock timeout",
			FailingEvent: &ref, Metadata: map[string]string{deadletter.MetadataTransient: "sqlstate 55P03"}})
		require.NoError(t, err)

		for n := 3; n <= 5; n++ {
			s.append(t, "s", storeEvent(n))
			require.Eventually(t, func() bool { return s.has(t, "alpha", n) }, eventually, 5*time.Millisecond,
				"event %d is projected while the resolve is blocked", n)
		}
		require.Equal(t, int64(1), store.inFlight.Load(), "the blocked resolve is still in flight")
		require.Equal(t, int64(2), store.calls.Load(), "the catch-ups of events 3 to 5 wait for it in one pending resolve")
		require.Equal(t, int64(1), store.maxInFlight.Load(), "one resolve at a time")
		require.Equal(t, deadletter.StatusFailed, get(t, direct, seeded.ID).Status)

		proxy.Resume()
		require.Eventually(t, func() bool { return get(t, direct, seeded.ID).Status == deadletter.StatusResolved }, eventually, 5*time.Millisecond,
			"once the store answers, the passed transient dead letter is resolved as healed")
		require.Eventually(t, func() bool { return store.calls.Load() == 3 && store.inFlight.Load() == 0 }, eventually, 5*time.Millisecond,
			"the pending resolve (up to event 5) runs once, after the blocked one")
		require.Equal(t, int64(1), store.maxInFlight.Load())
		// The healer counts the heal once the store's call has returned: await the count.
		require.Eventually(t, func() bool { return w.Stats("alpha").Healed == 1 }, eventually, 5*time.Millisecond, "alpha's healed count")
		rows, wrong := s.count(t, "alpha")
		require.Equal(t, 5, rows)
		require.Zero(t, wrong)
	})
}
