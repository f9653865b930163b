package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/projectiontest"
	"github.com/nudgeworks/nudge/worker"
)

// versionedModel is version version of the projection "blue": a row per event in blue_model_vN,
// read through the view blue_model.
func versionedModel(t testing.TB, version int) *projection.Projection {
	t.Helper()
	var p *projection.Projection
	p, err := projection.New("blue", projection.Config{
		Version: version,
		Tables:  []string{"blue_model"},
		InitFunc: func(ctx context.Context, hp projection.HookParams) error {
			_, err := hp.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+p.Table("blue_model")+` (n int PRIMARY KEY, times int NOT NULL)`)
			return err
		},
	}, projection.On("A", func(ctx context.Context, tx pgx.Tx, e projection.Event[projectiontest.Payload]) error {
		table := p.Table("blue_model")
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, 1) ON CONFLICT (n) DO UPDATE SET times = `+table+`.times + 1`, e.Data.N)
		return err
	}))
	require.NoError(t, err)
	return p
}

// TestBuildBesideThroughTriggers: a worker holding both versions of a projection, the safety
// net off. Version 2 is paused while version 1 serves 60 events; once resumed, the next
// append's trigger reaches version 2's own subscription, which builds it and cuts over by
// itself; readers of the view then see version 2's rows, every event once.
func TestBuildBesideThroughTriggers(t *testing.T) {
	t.Parallel()
	eachChannel(t, func(t *testing.T, s *setup, ch channel.Channel) {
		ctx := context.Background()
		v1, v2 := versionedModel(t, 1), versionedModel(t, 2)
		require.Equal(t, "blue.v2", v2.Name())
		pre, err := projection.NewRunner(s.backend, projection.RunnerConfig{Logger: s.logger}, v1, v2)
		require.NoError(t, err)
		require.NoError(t, pre.Init(ctx))
		require.NoError(t, pre.Pause(ctx, v2.Name()))
		s.start(t, ch, worker.Config{SafetyNetInterval: -1}, v1, v2)
		for i := range 60 {
			s.append(t, fmt.Sprintf("s-%d", i%3), storeEvent(i))
		}
		count := func(table string) (rows int) {
			require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&rows))
			return rows
		}
		require.Eventually(t, func() bool { return count("blue_model") == 60 }, eventually, 10*time.Millisecond)
		require.Zero(t, count("blue_model_v2"), "version 2 is paused")
		st, err := s.runner.Status(ctx, v2.Name())
		require.NoError(t, err)
		require.Equal(t, projection.VersionBuilding, st.VersionState)

		require.NoError(t, pre.Resume(ctx, v2.Name()))
		s.append(t, "s-0", storeEvent(60))
		require.Eventually(t, func() bool {
			var active int
			require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT version FROM nudge_projection_versions WHERE projection = 'blue' AND state = 'active'`).Scan(&active))
			return active == 2 && count("blue_model") == 61
		}, eventually, 10*time.Millisecond)
		var wrong int
		require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE times <> 1) FROM blue_model`).Scan(&wrong))
		require.Zero(t, wrong)
		require.Equal(t, 61, count("blue_model_v2"), "the view is version 2's table")
		st, err = s.runner.Status(ctx, v1.Name())
		require.NoError(t, err)
		require.Equal(t, projection.VersionRetired, st.VersionState)
	})
}

// TestRetiredSubscriptionIsUndeclared: a rolling deploy on the durable channels. A worker of
// version 1 serves; a worker of version 2 starts beside it, builds and cuts over; then the
// first worker stops. Version 2's worker undeclares version 1's subscription — on RabbitMQ
// only once no worker of version 1 consumes it — so no trigger is kept for it any more, while
// version 2's own subscription goes on.
func TestRetiredSubscriptionIsUndeclared(t *testing.T) {
	t.Parallel()
	eachChannel(t, func(t *testing.T, s *setup, ch channel.Channel) {
		ctx := context.Background()
		if _, ok := ch.(channel.Undeclarer); !ok {
			require.False(t, ch.Durable(), "a durable channel can undeclare")
			return
		}
		declared := ch.(interface { // channel/amqp's and channel/postgres's
			Declared(ctx context.Context, projection string) (bool, error)
		}).Declared
		isDeclared := func(name string) bool {
			ok, err := declared(ctx, name)
			require.NoError(t, err)
			return ok
		}
		count := func() (rows int) {
			require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM blue_model`).Scan(&rows))
			return rows
		}
		v1, v2 := versionedModel(t, 1), versionedModel(t, 2)
		_, stopV1 := s.startStoppable(t, ch, worker.Config{SafetyNetInterval: -1}, v1)
		n := 0
		appendOne := func() {
			s.append(t, fmt.Sprintf("s-%d", n%3), storeEvent(n))
			n++
		}
		for range 20 {
			appendOne()
		}
		require.Eventually(t, func() bool { return count() == n }, eventually, 10*time.Millisecond)

		s.start(t, ch, worker.Config{SafetyNetInterval: -1}, v2)
		require.Eventually(t, func() bool {
			appendOne()
			st, err := s.runner.Status(ctx, v2.Name())
			require.NoError(t, err)
			return st.VersionState == projection.VersionActive
		}, eventually, 10*time.Millisecond, "version 2 cuts over")
		if s.amqp != nil {
			appendOne()
			require.Eventually(t, func() bool { return count() == n }, eventually, 10*time.Millisecond)
			require.True(t, isDeclared(v1.Name()), "RabbitMQ keeps a queue while version 1's worker consumes it")
		}

		stopV1()
		require.Eventually(t, func() bool {
			appendOne() // a trigger: version 2's catch-up tries again
			return !isDeclared(v1.Name())
		}, eventually, 10*time.Millisecond, "version 1's subscription is undeclared")
		require.True(t, isDeclared(v2.Name()))
		appendOne()
		require.Eventually(t, func() bool { return count() == n }, eventually, 10*time.Millisecond, "version 2 serves every event")
	})
}

// costlyModel is versionedModel with cfg (its Version and Tables set here) and a handler that
// takes cost per event.
func costlyModel(t testing.TB, version int, cfg projection.Config, cost time.Duration) *projection.Projection {
	t.Helper()
	var p *projection.Projection
	cfg.Version, cfg.Tables = version, []string{"blue_model"}
	cfg.InitFunc = func(ctx context.Context, hp projection.HookParams) error {
		_, err := hp.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+p.Table("blue_model")+` (n int PRIMARY KEY, times int NOT NULL)`)
		return err
	}
	p, err := projection.New("blue", cfg, projection.On("A", func(ctx context.Context, tx pgx.Tx, e projection.Event[projectiontest.Payload]) error {
		if cost > 0 {
			timer := time.NewTimer(cost)
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
				return ctx.Err()
			}
		}
		table := p.Table("blue_model")
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, 1) ON CONFLICT (n) DO UPDATE SET times = `+table+`.times + 1`, e.Data.N)
		return err
	}))
	require.NoError(t, err)
	return p
}

// TestRollingDeployPastAStoppedVersionOne: a rolling deploy stops version 1's only worker
// first; meanwhile events are appended, more than version 2 can handle within BatchTimeout (a
// known cost per event). Version 2's worker starts, builds past version 1's frozen position in
// ordinary batches (claiming those events) and cuts over by itself, while appends go on;
// readers of the view then see every event once.
func TestRollingDeployPastAStoppedVersionOne(t *testing.T) {
	t.Parallel()
	eachChannel(t, func(t *testing.T, s *setup, ch channel.Channel) {
		ctx := context.Background()
		cfg := projection.Config{BatchSize: 50, BatchTimeout: 300 * time.Millisecond, MaxBatchDuration: 150 * time.Millisecond}
		v1, v2 := costlyModel(t, 1, cfg, 0), costlyModel(t, 2, cfg, time.Millisecond)
		count := func(table string) (rows int) {
			require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&rows))
			return rows
		}
		appendN := func(from, n int) {
			events := make([]eventstore.EventData, n)
			for i := range events {
				events[i] = storeEvent(from + i)
			}
			s.append(t, fmt.Sprintf("s-%d", from%3), events...)
		}
		_, stop := s.startStoppable(t, ch, worker.Config{}, v1)
		appendN(0, 50)
		require.Eventually(t, func() bool { return count("blue_model") == 50 }, eventually, 10*time.Millisecond)
		stop() // version 1's only worker stops first
		for k := range 12 {
			appendN(50+50*k, 50) // 600 events: 600 ms of version 2's handlers, twice BatchTimeout
		}
		s.start(t, ch, worker.Config{}, v2)
		for k := range 5 {
			appendN(650+10*k, 10) // appends go on
		}
		require.Eventually(t, func() bool {
			var active int
			require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT version FROM nudge_projection_versions WHERE projection = 'blue' AND state = 'active'`).Scan(&active))
			return active == 2 && count("blue_model") == 700
		}, eventually, 10*time.Millisecond)
		var wrong int
		require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE times <> 1) FROM blue_model`).Scan(&wrong))
		require.Zero(t, wrong, "every event in version 2's model once")
		require.Equal(t, 700, count("blue_model_v2"), "the view is version 2's table")
	})
}
