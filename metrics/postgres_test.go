package metrics_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
	dlpostgres "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/metrics"
	"github.com/nudgeworks/nudge/projection"
	pgproj "github.com/nudgeworks/nudge/projection/postgres"
)

// TestMetricsOnPostgreSQL: the scrape-time gauges read from projection/postgres and
// deadletter/postgres: lag before and after catch-up, held by the horizon while a writing
// transaction is open, the failing state, and the failed dead letters.
//
// The xmin horizon is cluster-wide: other tests' transactions can hold events back for a
// moment, so the checks that need everything readable wait for it.
func TestMetricsOnPostgreSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	store, err := espg.New(db.Pool, espg.Config{})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	backend, err := pgproj.New(store)
	require.NoError(t, err)
	require.NoError(t, backend.Migrate(ctx))
	dead, err := dlpostgres.New(db.Pool, dlpostgres.Config{})
	require.NoError(t, err)
	require.NoError(t, dead.Migrate(ctx))

	tickets, err := projection.New("tickets", projection.Config{
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS tickets (n int PRIMARY KEY)`)
			return err
		},
	},
		projection.On("Registered", func(ctx context.Context, tx pgx.Tx, e projection.Event[ticket]) error {
			_, err := tx.Exec(ctx, `INSERT INTO tickets VALUES ($1)`, e.Data.N)
			return err
		}),
		projection.On("Poison", func(context.Context, pgx.Tx, projection.Event[ticket]) error { return errors.New("poisoned") }))
	require.NoError(t, err)
	m, g := newMetrics(t)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: testlog.New(t), OnBatch: m.ObserveBatch}, tickets)
	require.NoError(t, err)
	require.NoError(t, runner.Init(ctx))
	require.NoError(t, m.WatchRunner(runner))
	require.NoError(t, m.WatchDeadLetters(dead, runner.Names()...))

	appendEvent := func(typ string, n int) eventstore.AppendResult {
		t.Helper()
		data, err := eventstore.NewEventData(typ, ticket{N: n})
		require.NoError(t, err)
		res, err := store.Append(ctx, "tickets", eventstore.Any, data)
		require.NoError(t, err)
		return res
	}
	lag := func() float64 { return mustValue(t, g, "nudge_projection_lag_events", "projection", "tickets") }
	held := func() float64 { return mustValue(t, g, "nudge_projection_held_by_horizon", "projection", "tickets") }
	wait := func(what string, cond func() bool) {
		t.Helper()
		require.Eventually(t, cond, testwait.For(2*time.Minute), 10*time.Millisecond, what)
	}

	var last eventstore.AppendResult
	for n := range 5 {
		last = appendEvent("Registered", n)
	}
	storetest.Settle(t, store, last.Last())
	wait("five events to read", func() bool { return lag() == 5 })
	require.Positive(t, mustValue(t, g, "nudge_projection_lag_seconds", "projection", "tickets"))
	require.Equal(t, 1.0, mustValue(t, g, "nudge_projection_state", "projection", "tickets", "state", "running"))

	// A writing transaction left open holds the next event back: the gauge says so.
	open, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = open.Rollback(ctx) }()
	_, err = open.Exec(ctx, `CREATE TEMP TABLE holding (x int); INSERT INTO holding VALUES (1)`)
	require.NoError(t, err)
	late := appendEvent("Registered", 5)
	require.Equal(t, 1.0, held(), "held by the open transaction")
	require.Equal(t, 5.0, lag(), "the late event is not readable yet")
	require.NoError(t, open.Rollback(ctx))
	storetest.Settle(t, store, late.Last())
	wait("the late event to be readable", func() bool { return lag() == 6 && held() == 0 })

	// Catch-up: lag 0, six events and one batch counted.
	wait("the projection to catch up", func() bool {
		_, err := runner.CatchUp(ctx, "tickets")
		require.NoError(t, err)
		return lag() == 0
	})
	require.Equal(t, 0.0, mustValue(t, g, "nudge_projection_lag_seconds", "projection", "tickets"))
	require.Equal(t, 6.0, mustValue(t, g, "nudge_projection_events_projected_total", "projection", "tickets"))

	// A poison event: the projection fails on it, and its trigger is dead-lettered (twice:
	// the two entries fold into one failed record).
	poison := appendEvent("Poison", 6)
	storetest.Settle(t, store, poison.Last())
	_, err = runner.CatchUp(ctx, "tickets")
	require.ErrorIs(t, err, projection.ErrHandler)
	require.Equal(t, 1.0, mustValue(t, g, "nudge_projection_state", "projection", "tickets", "state", "failing"))
	require.Equal(t, 0.0, mustValue(t, g, "nudge_projection_state", "projection", "tickets", "state", "running"))
	require.Equal(t, 1.0, mustValue(t, g, "nudge_projection_handler_failures_total", "projection", "tickets", "event_type", "Poison"))
	require.Equal(t, 1.0, mustValue(t, g, "nudge_projection_batches_total", "projection", "tickets", "outcome", "failed"))
	wait("the poison event to be readable", func() bool { return lag() == 1 })

	require.Equal(t, 0.0, mustValue(t, g, "nudge_dead_letters_failed", "projection", "tickets"))
	var rec deadletter.Record
	for range 2 {
		rec, err = dead.Add(ctx, deadletter.Entry{Projection: "tickets", MessageUUID: "m-1", Error: "poisoned",
			FailingEvent: &eventstore.EventRef{ID: poison.Events[0].ID, Type: "Poison", Position: poison.Last()}})
		require.NoError(t, err)
	}
	require.Equal(t, 2, rec.Count)
	require.Equal(t, 1.0, mustValue(t, g, "nudge_dead_letters_failed", "projection", "tickets"))
	require.NoError(t, dead.Resolve(ctx, rec.ID, "test", "skipped", time.Now()))
	require.Equal(t, 0.0, mustValue(t, g, "nudge_dead_letters_failed", "projection", "tickets"))

	require.Equal(t, 0.0, mustValue(t, g, "nudge_metrics_collect_errors_total", "source", metrics.SourceStatus))
	require.Equal(t, 0.0, mustValue(t, g, "nudge_metrics_collect_errors_total", "source", metrics.SourceDeadLetters))
}
