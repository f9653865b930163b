package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel/gochannel"
	dlmemory "github.com/nudgeworks/nudge/deadletter/memory"
	"github.com/nudgeworks/nudge/eventstore"
	esmemory "github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/metrics"
	"github.com/nudgeworks/nudge/projection"
	pjmemory "github.com/nudgeworks/nudge/projection/memory"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/trigger"
	"github.com/nudgeworks/nudge/worker"
)

type ticket struct {
	N int `json:"n"`
}

// memoryEnv is the whole loop in memory, with metrics: two projections, good (batches of 4)
// and broken (fails on every Poison event), a GoChannel worker and a memory dead-letter store.
type memoryEnv struct {
	store  *esmemory.Store
	ch     *gochannel.Channel
	runner *projection.Runner
	worker *worker.Worker
	reg    *prometheus.Registry
	m      *metrics.Metrics
}

// newMemoryEnv returns the environment; configure, if given, adjusts the worker's Config.
func newMemoryEnv(t testing.TB, configure ...func(*worker.Config, *metrics.Metrics)) *memoryEnv {
	t.Helper()
	// Events are recorded a minute in the past, so the lag in seconds is plainly above zero.
	store, err := esmemory.New(esmemory.Config{NowFunc: func() time.Time { return time.Now().Add(-time.Minute) }})
	require.NoError(t, err)
	backend, err := pjmemory.New(store, pjmemory.Config{})
	require.NoError(t, err)
	ok := func(context.Context, projection.Event[ticket]) error { return nil }
	good, err := projection.New("good", projection.Config{BatchSize: 4}, projection.OnIdempotent("Registered", ok))
	require.NoError(t, err)
	broken, err := projection.New("broken", projection.Config{}, projection.OnIdempotent("Registered", ok),
		projection.OnIdempotent("Poison", func(context.Context, projection.Event[ticket]) error { return errors.New("poisoned") }))
	require.NoError(t, err)

	m, reg := newMetrics(t)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: testlog.New(t), OnBatch: m.ObserveBatch}, good, broken)
	require.NoError(t, err)
	require.NoError(t, runner.Init(context.Background()))
	ch, err := gochannel.New(gochannel.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	dead := dlmemory.New(dlmemory.Config{})
	cfg := worker.Config{
		Runner: runner, Channel: ch, DeadLetters: dead, Logger: testlog.New(t),
		SafetyNetInterval: -1, // the start-up catch-up only: every other catch-up comes from a trigger of the test's
		Retry:             retry.Policy{MaxAttempts: 3, InitialInterval: time.Millisecond, MaxInterval: 2 * time.Millisecond},
	}
	for _, fn := range configure {
		fn(&cfg, m)
	}
	w, err := worker.New(cfg)
	require.NoError(t, err)
	require.NoError(t, m.WatchRunner(runner))
	require.NoError(t, m.WatchWorker(w, runner.Names()...))
	require.NoError(t, m.WatchDeadLetters(dead, runner.Names()...))
	return &memoryEnv{store: store, ch: ch, runner: runner, worker: w, reg: reg, m: m}
}

func (e *memoryEnv) append(t testing.TB, typ string, n int) eventstore.AppendResult {
	t.Helper()
	data, err := eventstore.NewEventData(typ, ticket{N: n})
	require.NoError(t, err)
	res, err := e.store.Append(context.Background(), fmt.Sprintf("ticket-%d", n), eventstore.Any, data)
	require.NoError(t, err)
	return res
}

// run runs the worker until the test ends.
func (e *memoryEnv) run(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := e.worker.Run(ctx); err != nil {
			t.Errorf("worker: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	select {
	case <-e.worker.Running():
	case <-time.After(testwait.For(time.Minute)):
		t.Fatal("the worker did not start")
	}
}

func (e *memoryEnv) eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, testwait.For(time.Minute), 5*time.Millisecond, what)
}

// TestMetricsOfARealRun runs the loop in memory and checks each metric against what happened:
// events and batches exactly, lag before and after catch-up, redundant triggers for
// duplicates, and a failing projection's failures, dead letters and state.
func TestMetricsOfARealRun(t *testing.T) {
	t.Parallel()
	e := newMemoryEnv(t)
	g := e.reg
	const events = 10
	var last eventstore.AppendResult
	for n := range events {
		last = e.append(t, "Registered", n)
	}

	// Before the worker runs, both projections lag.
	for _, name := range []string{"good", "broken"} {
		require.Equal(t, float64(events), mustValue(t, g, "nudge_projection_lag_events", "projection", name))
		require.GreaterOrEqual(t, mustValue(t, g, "nudge_projection_lag_seconds", "projection", name), 59.0)
		require.Equal(t, 1.0, mustValue(t, g, "nudge_projection_state", "projection", name, "state", "running"))
		require.Equal(t, 0.0, mustValue(t, g, "nudge_projection_held_by_horizon", "projection", name))
		require.Equal(t, 0.0, mustValue(t, g, "nudge_projection_events_projected_total", "projection", name))
	}

	// The start-up catch-up handles everything.
	e.run(t)
	// The runner reports a batch (OnBatch) just after its commit, which the lag shows first:
	// wait for the report of the last batch too (its duration is observed last).
	e.eventually(t, "both projections catch up and report every batch", func() bool {
		return mustValue(t, g, "nudge_projection_lag_events", "projection", "good") == 0 &&
			mustValue(t, g, "nudge_projection_lag_events", "projection", "broken") == 0 &&
			mustValue(t, g, "nudge_projection_batch_duration_seconds", "projection", "good") == 3 &&
			mustValue(t, g, "nudge_projection_batch_duration_seconds", "projection", "broken") == 1
	})
	for _, name := range []string{"good", "broken"} {
		require.Equal(t, 0.0, mustValue(t, g, "nudge_projection_lag_seconds", "projection", name))
		require.Equal(t, float64(events), mustValue(t, g, "nudge_projection_events_projected_total", "projection", name))
		require.Equal(t, 1.0, mustValue(t, g, "nudge_worker_catchups_total", "projection", name))
	}
	require.Equal(t, 3.0, mustValue(t, g, "nudge_projection_batches_total", "projection", "good", "outcome", "committed"), "4+4+2")
	require.Equal(t, 1.0, mustValue(t, g, "nudge_projection_batches_total", "projection", "broken", "outcome", "committed"))
	require.Equal(t, 3.0, mustValue(t, g, "nudge_projection_batch_duration_seconds", "projection", "good"))

	// Duplicate triggers for a position both projections have passed cost no read.
	const duplicates = 5
	for range duplicates {
		require.NoError(t, e.ch.Publish(context.Background(), trigger.ForAppend(last, time.Now())))
	}
	e.eventually(t, "the duplicates are counted as redundant", func() bool {
		return mustValue(t, g, "nudge_worker_triggers_redundant_total", "projection", "good") == duplicates &&
			mustValue(t, g, "nudge_worker_triggers_redundant_total", "projection", "broken") == duplicates
	})
	for _, name := range []string{"good", "broken"} {
		require.Equal(t, float64(duplicates), mustValue(t, g, "nudge_worker_triggers_received_total", "projection", name))
		require.Equal(t, 1.0, mustValue(t, g, "nudge_worker_catchups_total", "projection", name), "no catch-up for a redundant trigger")
	}

	// A poison event: broken fails on it 3 times (the retry policy), then dead-letters the
	// trigger; good does not handle the type, so the trigger is redundant for it.
	poison := e.append(t, "Poison", events)
	require.NoError(t, e.ch.Publish(context.Background(), trigger.ForAppend(poison, time.Now())))
	e.eventually(t, "broken dead-letters the trigger; good finds it redundant", func() bool {
		return mustValue(t, g, "nudge_worker_triggers_dead_lettered_total", "projection", "broken") == 1 &&
			mustValue(t, g, "nudge_worker_triggers_redundant_total", "projection", "good") == duplicates+1
	})
	checks := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"nudge_projection_batches_total", []string{"projection", "broken", "outcome", "failed"}, 3},
		{"nudge_projection_batches_total", []string{"projection", "broken", "outcome", "error"}, 0},
		{"nudge_projection_batches_total", []string{"projection", "good", "outcome", "failed"}, 0},
		{"nudge_projection_handler_failures_total", []string{"projection", "broken", "event_type", "Poison"}, 3},
		{"nudge_projection_events_projected_total", []string{"projection", "broken"}, events},
		{"nudge_worker_catchups_total", []string{"projection", "broken"}, 1 + 3},
		{"nudge_worker_catchup_failures_total", []string{"projection", "broken"}, 3},
		{"nudge_worker_triggers_received_total", []string{"projection", "broken"}, duplicates + 3},
		{"nudge_worker_triggers_received_total", []string{"projection", "good"}, duplicates + 1},
		{"nudge_worker_triggers_redundant_total", []string{"projection", "good"}, duplicates + 1},
		{"nudge_worker_triggers_dead_lettered_total", []string{"projection", "good"}, 0},
		{"nudge_worker_triggers_invalid_total", []string{"projection", "broken"}, 0},
		{"nudge_dead_letters_failed", []string{"projection", "broken"}, 1},
		{"nudge_dead_letters_failed", []string{"projection", "good"}, 0},
		{"nudge_projection_state", []string{"projection", "broken", "state", "failing"}, 1},
		{"nudge_projection_state", []string{"projection", "broken", "state", "running"}, 0},
		{"nudge_projection_state", []string{"projection", "good", "state", "running"}, 1},
		{"nudge_projection_lag_events", []string{"projection", "broken"}, 1},
		{"nudge_projection_lag_events", []string{"projection", "good"}, 0},
		{"nudge_metrics_collect_errors_total", []string{"source", metrics.SourceStatus}, 0},
		{"nudge_metrics_collect_errors_total", []string{"source", metrics.SourceDeadLetters}, 0},
	}
	for _, c := range checks {
		require.Equal(t, c.want, mustValue(t, g, c.name, c.labels...), "%s%v", c.name, c.labels)
	}
	require.Greater(t, mustValue(t, g, "nudge_projection_lag_seconds", "projection", "broken"), 59.0)

	// The worker counters are the worker's own Stats, not a second bookkeeping.
	for _, name := range e.runner.Names() {
		s := e.worker.Stats(name)
		for metric, v := range map[string]int64{
			"nudge_worker_triggers_received_total": s.Received, "nudge_worker_triggers_redundant_total": s.Redundant,
			"nudge_worker_triggers_ignored_total": s.Ignored, "nudge_worker_triggers_invalid_total": s.Invalid,
			"nudge_worker_catchups_total": s.CatchUps, "nudge_worker_catchup_failures_total": s.Failures,
			"nudge_worker_triggers_dead_lettered_total": s.DeadLettered, "nudge_worker_dead_letters_healed_total": s.Healed,
		} {
			require.Equal(t, float64(v), mustValue(t, g, metric, "projection", name), "%s{projection=%q}", metric, name)
		}
	}
}

// fakeStats returns fixed counters for the names it knows.
type fakeStats map[string]worker.Stats

func (f fakeStats) Stats(name string) worker.Stats { return f[name] }

// namedStats also has Names, as a worker with a names accessor would.
type namedStats struct{ fakeStats }

func (n namedStats) Names() []string { return []string{"a"} }

// TestWatchWorkerNames: names are required unless the worker can tell them; each field of
// Stats lands in its counter.
func TestWatchWorkerNames(t *testing.T) {
	t.Parallel()
	stats := fakeStats{"a": {Received: 1, Redundant: 2, Ignored: 3, Invalid: 4, CatchUps: 5, Failures: 6, DeadLettered: 7, Healed: 8,
		Partitions: 9, PartitionsClaimed: 10, PartitionsGivenBack: 11}}
	m, _ := newMetrics(t)
	require.ErrorIs(t, m.WatchWorker(stats), metrics.ErrInvalidConfig, "no names")
	require.ErrorIs(t, m.WatchWorker(nil, "a"), metrics.ErrInvalidConfig)
	require.ErrorIs(t, m.WatchWorker(stats, "a", "a"), metrics.ErrInvalidConfig)

	m, reg := newMetrics(t)
	require.NoError(t, m.WatchWorker(namedStats{stats}))
	for metric, want := range map[string]float64{
		"nudge_worker_triggers_received_total": 1, "nudge_worker_triggers_redundant_total": 2, "nudge_worker_triggers_ignored_total": 3,
		"nudge_worker_triggers_invalid_total": 4, "nudge_worker_catchups_total": 5, "nudge_worker_catchup_failures_total": 6,
		"nudge_worker_triggers_dead_lettered_total": 7, "nudge_worker_dead_letters_healed_total": 8,
		"nudge_worker_partitions_owned": 9, "nudge_worker_partitions_claimed_total": 10, "nudge_worker_partitions_given_back_total": 11,
	} {
		require.Equal(t, want, mustValue(t, reg, metric, "projection", "a"), metric)
	}
	err := m.WatchWorker(stats, "b")
	require.ErrorIs(t, err, metrics.ErrAlreadyRegistered)
	require.ErrorAs(t, err, new(prometheus.AlreadyRegisteredError))
}
