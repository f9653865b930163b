package worker_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/deadletter"
	dlpg "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/internal/stallproxy"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/worker"
)

// stalledPool returns a pool on the test's database that connects through a stall proxy, and
// the proxy. Both close when the test ends, the pool first.
func (s *setup) stalledPool(t *testing.T) (*pgxpool.Pool, *stallproxy.Proxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(s.db.URL)
	require.NoError(t, err)
	proxy, err := stallproxy.Start(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, proxy.Close()) })
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = "127.0.0.1", proxy.Port(), nil
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Resume(); pool.Close() })
	return pool, proxy
}

// watchedStore counts the Adds of a dead-letter store and those that ended with their
// context's deadline.
type watchedStore struct {
	deadletter.Store
	adds, timedOut atomic.Int64
}

func (w *watchedStore) Add(ctx context.Context, e deadletter.Entry) (deadletter.Record, error) {
	w.adds.Add(1)
	rec, err := w.Store.Add(ctx, e)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		w.timedOut.Add(1)
	}
	return rec, err
}

// TestDeadLetterDatabasePartitioned: the dead-letter database is behind a proxy that stalls
// (connections stay open, no byte flows — a partition, not a refusal). A trigger the
// projection keeps failing on must not hold its handler forever: each dead-letter write gives
// up at DeadLetterTimeout, the trigger is nacked, not acked, and comes back (the writes
// repeat), while nothing reaches the dead-letter table and another projection works on. Once
// the partition heals the dead letter is written, and after the fix the projection passes the
// event and everything behind it.
func TestDeadLetterDatabasePartitioned(t *testing.T) {
	eachChannel(t, func(t *testing.T, s *setup, ch channel.Channel) {
		ctx := context.Background()
		pool, proxy := s.stalledPool(t)
		direct, err := dlpg.New(s.db.Pool, dlpg.Config{}) // reads the table around the proxy
		require.NoError(t, err)
		require.NoError(t, direct.Migrate(ctx))
		behind, err := dlpg.New(pool, dlpg.Config{})
		require.NoError(t, err)
		store := &watchedStore{Store: behind}

		var broken atomic.Bool
		broken.Store(true)
		alpha := s.model(t, "alpha", func(n int) error {
			if n == 1 && broken.Load() {
				return errors.New("cannot project event 1 yet")
			}
			return nil
		})
		s.start(t, ch, worker.Config{
			SafetyNetInterval: -1,
			Retry:             retry.Policy{MaxAttempts: 2, InitialInterval: 10 * time.Millisecond, MaxInterval: 20 * time.Millisecond},
			DeadLetters:       store,
			DeadLetterTimeout: 300 * time.Millisecond,
		}, alpha, s.model(t, "beta", nil))

		proxy.Stall()
		s.append(t, "s", storeEvent(1), storeEvent(2))
		require.Eventually(t, func() bool { return store.timedOut.Load() >= 3 }, eventually, 5*time.Millisecond,
			"each dead-letter write gives up at its deadline and the nacked trigger comes back for another")
		recs, err := direct.List(ctx, deadletter.Filter{})
		require.NoError(t, err)
		require.Empty(t, recs, "no dead letter was written, so the trigger was never acked")
		require.Eventually(t, func() bool { rows, _ := s.count(t, "beta"); return rows == 2 }, eventually, 5*time.Millisecond,
			"another projection works on during the partition")
		require.False(t, s.has(t, "alpha", 1))

		proxy.Resume()
		require.Eventually(t, func() bool {
			recs, err = direct.List(ctx, deadletter.Filter{Projection: "alpha"})
			require.NoError(t, err)
			return len(recs) == 1
		}, eventually, 5*time.Millisecond, "the dead letter is written once the partition heals")
		require.NotNil(t, recs[0].FailingEvent)
		require.Contains(t, recs[0].Error, "cannot project event 1 yet")

		broken.Store(false)
		s.append(t, "s", storeEvent(3))
		require.Eventually(t, func() bool { rows, _ := s.count(t, "alpha"); return rows == 3 }, eventually, 5*time.Millisecond,
			"after the fix the projection passes the event and works on")
		_, wrong := s.count(t, "alpha")
		require.Zero(t, wrong)
		require.Eventually(t, func() bool { return get(t, direct, recs[0].ID).Healed() }, eventually, 5*time.Millisecond,
			"the projection passed the event: the dead letter is resolved as healed")
	})
}
