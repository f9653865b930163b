package metrics_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
	pgproj "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/trigger"
	"github.com/nudgeworks/nudge/worker"
)

// histogram gathers g and returns the histogram name{projection}.
func histogram(t testing.TB, g prometheus.Gatherer, name, projectionName string) *dto.Histogram {
	t.Helper()
	return histogramOf(t, g, name, "projection", projectionName)
}

// histogramOf gathers g and returns the histogram name{label=value}.
func histogramOf(t testing.TB, g prometheus.Gatherer, name, label, value string) *dto.Histogram {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return s.GetHistogram()
				}
			}
		}
	}
	t.Fatalf("no histogram %s{%s=%q}", name, label, value)
	return nil
}

// below returns how many of h's samples are at most le (the count of the largest bucket
// boundary not above le).
func below(h *dto.Histogram, le float64) uint64 {
	var n uint64
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() <= le {
			n = b.GetCumulativeCount()
		}
	}
	return n
}

// TestObserveBatchStaleness: a committed batch's staleness samples land in the histogram, one
// per event, in their buckets; its lock wait in the lock-wait histogram; a failed batch adds
// neither.
func TestObserveBatchStaleness(t *testing.T) {
	t.Parallel()
	m, g := newMetrics(t)
	m.ObserveBatch(projection.BatchReport{Projection: "a", Events: 3, LockWait: 3 * time.Millisecond,
		Staleness: []time.Duration{500 * time.Microsecond, 300 * time.Millisecond, 2 * time.Second}})
	m.ObserveBatch(projection.BatchReport{Projection: "a", Err: errors.New("database down"),
		Staleness: []time.Duration{time.Hour}})

	h := histogram(t, g, "nudge_projection_event_staleness_seconds", "a")
	require.Equal(t, uint64(3), h.GetSampleCount())
	require.InDelta(t, 2.3005, h.GetSampleSum(), 1e-9)
	require.Equal(t, uint64(1), below(h, 0.001), "0.5 ms in the first bucket (1 ms)")
	require.Equal(t, uint64(1), below(h, 0.256))
	require.Equal(t, uint64(2), below(h, 0.512), "300 ms in (0.256, 0.512]")
	require.Equal(t, uint64(2), below(h, 1.024))
	require.Equal(t, uint64(3), below(h, 2.048))
	lock := histogram(t, g, "nudge_projection_batch_lock_wait_seconds", "a")
	require.Equal(t, uint64(1), lock.GetSampleCount())
	require.InDelta(t, 0.003, lock.GetSampleSum(), 1e-9)
}

// TestStalenessOnPostgreSQL: the staleness a PostgreSQL runner reports is measured in the
// database's clock from each event's recorded_at to the batch's commit: events left unread
// for at least 300 ms (by the database's clock) are all observed at 300 ms or more, and at
// most their age read after the commit.
func TestStalenessOnPostgreSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	store, err := espg.New(db.Pool, espg.Config{})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	backend, err := pgproj.New(store)
	require.NoError(t, err)
	require.NoError(t, backend.Migrate(ctx))
	tickets, err := projection.New("tickets", projection.Config{},
		projection.On("Registered", func(context.Context, pgx.Tx, projection.Event[ticket]) error { return nil }))
	require.NoError(t, err)
	m, g := newMetrics(t)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: testlog.New(t), OnBatch: m.ObserveBatch}, tickets)
	require.NoError(t, err)
	require.NoError(t, runner.Init(ctx))

	var last eventstore.AppendResult
	for n := range 3 {
		data, err := eventstore.NewEventData("Registered", ticket{N: n})
		require.NoError(t, err)
		last, err = store.Append(ctx, "tickets", eventstore.Any, data)
		require.NoError(t, err)
	}
	storetest.Settle(t, store, last.Last())
	const minAge = 0.3
	age := func(agg string) float64 {
		var s float64
		require.NoError(t, db.Pool.QueryRow(ctx,
			`SELECT extract(epoch FROM clock_timestamp() - `+agg+`(recorded_at))::float8 FROM nudge_events`).Scan(&s))
		return s
	}
	require.Eventually(t, func() bool { return age("max") >= minAge }, testwait.For(time.Minute), 20*time.Millisecond,
		"the database's clock to pass the newest event by 300 ms")

	res, err := runner.CatchUp(ctx, "tickets")
	require.NoError(t, err)
	require.Equal(t, 3, res.Events)
	oldest := age("min")

	h := histogram(t, g, "nudge_projection_event_staleness_seconds", "tickets")
	require.Equal(t, uint64(3), h.GetSampleCount(), "one sample per event")
	require.Zero(t, below(h, 0.256), "no event observed fresher than it was: %v", h)
	require.GreaterOrEqual(t, h.GetSampleSum(), 3*minAge)
	require.LessOrEqual(t, h.GetSampleSum(), 3*oldest, "no event observed older than its age after the commit")
	lock := histogram(t, g, "nudge_projection_batch_lock_wait_seconds", "tickets")
	require.Equal(t, uint64(1), lock.GetSampleCount())
}

// TestObserveTrigger: an append trigger's transit, from its making to its arrival, in the
// projection's histogram; a trigger with no making time is left out.
func TestObserveTrigger(t *testing.T) {
	t.Parallel()
	m, g := newMetrics(t)
	made := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m.ObserveTrigger(worker.TriggerReport{Projection: "a", Trigger: trigger.Trigger{At: made}, Received: made.Add(5 * time.Millisecond)})
	m.ObserveTrigger(worker.TriggerReport{Projection: "a", Received: made})
	h := histogram(t, g, "nudge_projection_trigger_transit_seconds", "a")
	require.Equal(t, uint64(1), h.GetSampleCount())
	require.InDelta(t, 0.005, h.GetSampleSum(), 1e-9)
	require.Equal(t, uint64(0), below(h, 0.004))
	require.Equal(t, uint64(1), below(h, 0.008))
}

// TestObserveRelay: a relay batch's delays land in the relay's histogram, one per event; a
// failed batch adds none (its events are published again).
func TestObserveRelay(t *testing.T) {
	t.Parallel()
	m, g := newMetrics(t)
	m.ObserveRelay(projection.BatchReport{Projection: "nudge-relay", Events: 2,
		Staleness: []time.Duration{3 * time.Millisecond, 600 * time.Millisecond}})
	m.ObserveRelay(projection.BatchReport{Projection: "nudge-relay", Err: errors.New("broker down"),
		Staleness: []time.Duration{time.Hour}})
	h := histogramOf(t, g, "nudge_relay_delay_seconds", "relay", "nudge-relay")
	require.Equal(t, uint64(2), h.GetSampleCount())
	require.InDelta(t, 0.603, h.GetSampleSum(), 1e-9)
	require.Equal(t, uint64(0), below(h, 0.002))
	require.Equal(t, uint64(1), below(h, 0.004))
	require.Equal(t, uint64(2), below(h, 1.024))
}
