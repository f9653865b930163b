package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
	dlpostgres "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/projection"
	pgproj "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/worker"
)

// TestRunNotMigrated: Run against a database where a Migrate never ran returns, without the
// context ending, an error that names what is missing and says to migrate — it does not log
// failed catch-ups and run on. The relay does the same.
func TestRunNotMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	store, err := espg.New(db.Pool, espg.Config{})
	require.NoError(t, err)
	backend, err := pgproj.New(store)
	require.NoError(t, err)
	dead, err := dlpostgres.New(db.Pool, dlpostgres.Config{})
	require.NoError(t, err)
	s := &setup{db: db, store: store, backend: backend, logger: testlog.New(t)}

	run := func(cfg worker.Config) error {
		ch := goChannel(t)
		t.Cleanup(func() { _ = ch.Close() })
		runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: s.logger}, s.model(t, "tickets", nil))
		require.NoError(t, err)
		cfg.Runner, cfg.Channel, cfg.Logger = runner, ch, s.logger
		if cfg.DeadLetters == nil {
			cfg.DeadLetters = dead
		}
		w, err := worker.New(cfg)
		require.NoError(t, err)
		// A deadline only so that a regression fails instead of hanging: Run must return on
		// its own, long before it.
		runCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		err = w.Run(runCtx)
		require.NoError(t, runCtx.Err(), "Run returned by itself")
		return err
	}

	err = run(worker.Config{})
	require.ErrorIs(t, err, eventstore.ErrNotMigrated)
	require.ErrorContains(t, err, "`nudge migrate`")

	rel, err := relay.New(backend, goChannel(t), relay.Config{Logger: s.logger})
	require.NoError(t, err)
	require.ErrorIs(t, rel.Run(ctx), eventstore.ErrNotMigrated)

	require.NoError(t, store.Migrate(ctx))
	err = run(worker.Config{})
	require.ErrorIs(t, err, projection.ErrNotMigrated)
	require.ErrorContains(t, err, "Backend.Migrate) or `nudge migrate` first")

	require.NoError(t, backend.Migrate(ctx))
	err = run(worker.Config{DeadLetters: dead})
	require.ErrorIs(t, err, deadletter.ErrNotMigrated)
	require.ErrorContains(t, err, "Store.Migrate) or `nudge migrate` first")
}
