package worker_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel/gochannel"
	dlmemory "github.com/nudgeworks/nudge/deadletter/memory"
	"github.com/nudgeworks/nudge/eventstore"
	memstore "github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/projection"
	memproj "github.com/nudgeworks/nudge/projection/memory"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/worker"
)

// TestRunTwice: every type with a Run is safe to misuse. A Worker runs once: a second Run, at
// the same time or later, returns ErrRunTwice (no panic). A Poller and a Relay refuse a second
// Run while one runs (ErrAlreadyRunning) and run again once it has returned.
func TestRunTwice(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	backend, err := memproj.New(store, memproj.Config{})
	require.NoError(t, err)
	p, err := projection.New("twice", projection.Config{},
		projection.OnIdempotent("A", func(context.Context, projection.Event[json.RawMessage]) error { return nil }))
	require.NoError(t, err)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{}, p)
	require.NoError(t, err)
	require.NoError(t, runner.Init(context.Background()))

	t.Run("worker", func(t *testing.T) {
		ch, err := gochannel.New(gochannel.Config{})
		require.NoError(t, err)
		defer func() { _ = ch.Close() }()
		w, err := worker.New(worker.Config{Runner: runner, Channel: ch, SafetyNetInterval: -1, HorizonPollInterval: -1,
			DeadLetters: dlmemory.New(dlmemory.Config{})})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		first := runInBackground(ctx, w.Run)
		<-w.Running()
		require.ErrorIs(t, w.Run(ctx), worker.ErrRunTwice, "while it runs")
		cancel()
		require.NoError(t, <-first)
		require.ErrorIs(t, w.Run(context.Background()), worker.ErrRunTwice, "after it returned")
	})

	// restartable runs two Runs at once, twice over: one of them fails with ErrAlreadyRunning
	// at once, the other runs until ctx ends; the second round shows Run works again.
	restartable := func(t *testing.T, run func(context.Context) error) {
		t.Helper()
		for range 2 {
			ctx, cancel := context.WithCancel(context.Background())
			a, b := runInBackground(ctx, run), runInBackground(ctx, run)
			var first error
			select {
			case first = <-a:
				a = b
			case first = <-b:
			}
			require.ErrorIs(t, first, projection.ErrAlreadyRunning)
			cancel()
			require.NoError(t, <-a)
		}
	}
	t.Run("poller", func(t *testing.T) {
		poller, err := projection.NewPoller(runner, projection.PollerConfig{})
		require.NoError(t, err)
		restartable(t, poller.Run)
	})
	t.Run("relay", func(t *testing.T) {
		ch, err := gochannel.New(gochannel.Config{})
		require.NoError(t, err)
		defer func() { _ = ch.Close() }()
		rel, err := relay.New(backend, ch, relay.Config{})
		require.NoError(t, err)
		restartable(t, rel.Run)
	})
}

func runInBackground(ctx context.Context, run func(context.Context) error) <-chan error {
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	return done
}

// TestConfig: WithDefaults fills every default; a Config New cannot use is refused with an
// error matching worker.ErrInvalidConfig that names what is wrong.
func TestConfig(t *testing.T) {
	t.Parallel()
	cfg := worker.Config{}.WithDefaults()
	require.Equal(t, worker.SafetyNetIntervalDefault, cfg.SafetyNetInterval)
	require.Equal(t, worker.CloseTimeoutDefault, cfg.CloseTimeout)
	require.Equal(t, worker.StallAfterDefault, cfg.StallAfter)
	require.Equal(t, worker.HorizonWaitDefault, cfg.HorizonWait)
	require.Equal(t, worker.DeadLetterTimeoutDefault, cfg.DeadLetterTimeout)
	require.NotNil(t, cfg.Logger)
	require.Equal(t, cfg.Retry, cfg.Retry.WithDefaults())

	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	backend, err := memproj.New(store, memproj.Config{})
	require.NoError(t, err)
	p, err := projection.New("alpha", projection.Config{}, projection.OnAnyIdempotent(func(context.Context, eventstore.Event) error { return nil }))
	require.NoError(t, err)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{}, p)
	require.NoError(t, err)
	ch, err := gochannel.New(gochannel.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	dead := dlmemory.New(dlmemory.Config{})
	good := worker.Config{Runner: runner, Channel: ch, DeadLetters: dead}
	cases := map[string]struct {
		change func(*worker.Config)
		want   string
	}{
		"no dead letters":              {func(c *worker.Config) { c.DeadLetters = nil }, "DeadLetters"},
		"no runner":                    {func(c *worker.Config) { c.Runner = nil }, "Runner"},
		"negative close":               {func(c *worker.Config) { c.CloseTimeout = -time.Second }, "must not be negative"},
		"negative dead-letter timeout": {func(c *worker.Config) { c.DeadLetterTimeout = -time.Second }, "DeadLetterTimeout"},
		"bad retry":                    {func(c *worker.Config) { c.Retry.Multiplier = 0.5 }, "Retry"},
		"unknown projection":           {func(c *worker.Config) { c.Projections = []string{"beta"} }, "beta"},
	}
	for name, c := range cases {
		cfg := good
		c.change(&cfg)
		_, err := worker.New(cfg)
		require.ErrorIs(t, err, worker.ErrInvalidConfig, name)
		require.ErrorContains(t, err, c.want, name)
	}
	_, err = worker.New(good)
	require.NoError(t, err)
}
