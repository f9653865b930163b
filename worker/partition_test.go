package worker_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/deadletter"
	dlpg "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/stallproxy"
	"github.com/nudgeworks/nudge/projection"
	pgproj "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/projection/projectiontest"
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
		require.Equal(t, deadletter.StatusFailed, get(t, direct, recs[0].ID).Status,
			"not a transient cause: the record stays for the operator, though the projection passed it")
	})
}

// TestBatchDatabaseStalled: the projection's database stalls in the middle of a batch (the
// handler of event 2 stalls the proxy in front of it, then writes). The batch gives up at its
// BatchTimeout and rolls back, CatchUp returns ErrBatchTimeout — not a handler failure, so no
// failure is recorded on the event and nothing would be dead-lettered — and once the database
// is back the next catch-up handles every event once.
func TestBatchDatabaseStalled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSetup(t)
	pool, proxy := s.stalledPool(t)
	store, err := espg.New(pool, espg.Config{})
	require.NoError(t, err)
	backend, err := pgproj.New(store)
	require.NoError(t, err)

	var stallOnce atomic.Bool
	stallOnce.Store(true)
	table := pgx.Identifier{"alpha_model"}.Sanitize()
	alpha, err := projection.New("alpha", projection.Config{
		MaxBatchDuration: 100 * time.Millisecond,
		BatchTimeout:     500 * time.Millisecond,
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (n int PRIMARY KEY, times int NOT NULL)`)
			return err
		},
	}, projection.On("A", func(ctx context.Context, tx pgx.Tx, e projection.Event[projectiontest.Payload]) error {
		if e.Data.N == 2 && stallOnce.CompareAndSwap(true, false) {
			proxy.Stall() // mid-batch: event 1 is handled in this transaction, the rest is not
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, 1) ON CONFLICT (n) DO UPDATE SET times = `+table+`.times + 1`, e.Data.N)
		return err
	}))
	require.NoError(t, err)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: s.logger}, alpha)
	require.NoError(t, err)
	require.NoError(t, runner.Init(ctx))

	s.append(t, "s", storeEvent(1), storeEvent(2), storeEvent(3))
	require.Eventually(t, func() bool {
		events, err := s.store.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{Limit: 10})
		require.NoError(t, err)
		return len(events) == 3
	}, eventually, 5*time.Millisecond, "the events are readable (no open transaction on the server holds readers back)")
	_, err = runner.CatchUp(ctx, "alpha")
	require.ErrorIs(t, err, projection.ErrBatchTimeout, "the stalled batch gives up at its deadline")
	require.NotErrorIs(t, err, projection.ErrHandler, "a stalled database is not the event's fault")
	require.True(t, proxy.Stalled())
	proxy.Resume()

	direct, err := projection.NewRunner(s.backend, projection.RunnerConfig{Logger: s.logger}, alpha)
	require.NoError(t, err)
	st, err := direct.Status(ctx, "alpha")
	require.NoError(t, err)
	require.Nil(t, st.FailingEvent, "no failure recorded on an event")
	require.False(t, s.has(t, "alpha", 2), "the stalled batch rolled back (a busy machine may have committed event 1 in a batch of its own)")

	// The next catch-up handles the rest; on a busy machine a batch may pass its short
	// BatchTimeout again and roll back, and the one after goes on.
	require.Eventually(t, func() bool {
		_, err = runner.CatchUp(ctx, "alpha")
		return err == nil && s.has(t, "alpha", 3)
	}, eventually, 5*time.Millisecond, "the catch-up after the stall handles the rest: %v", err)
	rows, wrong := s.count(t, "alpha")
	require.Equal(t, 3, rows)
	require.Zero(t, wrong)
}
