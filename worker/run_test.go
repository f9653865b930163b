package worker_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel/gochannel"
	dlmemory "github.com/nudgeworks/nudge/deadletter/memory"
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
	store := memstore.New(memstore.Config{})
	backend, err := memproj.New(store, memproj.Config{})
	require.NoError(t, err)
	p, err := projection.New("twice", projection.Config{},
		projection.OnIdempotent("A", func(context.Context, projection.Event[json.RawMessage]) error { return nil }))
	require.NoError(t, err)
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{}, p)
	require.NoError(t, err)
	require.NoError(t, runner.Init(context.Background()))

	t.Run("worker", func(t *testing.T) {
		ch := gochannel.New(gochannel.Config{})
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
		ch := gochannel.New(gochannel.Config{})
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
