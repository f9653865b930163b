package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
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
