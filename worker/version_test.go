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
