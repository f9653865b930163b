package projectiontest

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/projection"
)

// replayFlags records, per event a version-2 handler saw, Event.Replay (where the handler kind
// has it) and projection.Replaying(ctx).
type replayFlags struct {
	mu   sync.Mutex
	seen []flagPair
}

type flagPair struct{ replay, replaying bool }

func (f *replayFlags) record(ctx context.Context, version int, replay bool) {
	if version != 2 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen = append(f.seen, flagPair{replay: replay, replaying: projection.Replaying(ctx)})
}

// replayFlagKinds are the handler kinds, each as a handler that records its flags. A kind
// without Event.Replay (OnAnyIdempotent) records Replaying(ctx) for both.
var replayFlagKinds = []struct {
	name    string
	handler func(f *replayFlags, version int) projection.Handler
}{
	{"on", func(f *replayFlags, version int) projection.Handler {
		return projection.On("A", func(ctx context.Context, _ pgx.Tx, e projection.Event[Payload]) error {
			f.record(ctx, version, e.Replay)
			return nil
		})
	}},
	{"onidempotent", func(f *replayFlags, version int) projection.Handler {
		return projection.OnIdempotent("A", func(ctx context.Context, e projection.Event[Payload]) error {
			f.record(ctx, version, e.Replay)
			return nil
		})
	}},
	{"onanyidempotent", func(f *replayFlags, version int) projection.Handler {
		return projection.OnAnyIdempotent(func(ctx context.Context, _ eventstore.Event) error {
			f.record(ctx, version, projection.Replaying(ctx))
			return nil
		})
	}},
	{"onqueued", func(f *replayFlags, version int) projection.Handler {
		return projection.OnQueued("A", func(ctx context.Context, _ *projection.Queue, e projection.Event[Payload]) error {
			f.record(ctx, version, e.Replay)
			return nil
		})
	}},
}

// testVersionReplayFlags: every handler kind of a version built beside the active one sees its
// history as a replay through both Event.Replay and Replaying(ctx), so a handler that skips side
// effects on replay with either sends none for history. A backend that cannot run a kind (the
// memory backend and the handlers that need a transaction) refuses to register it.
func testVersionReplayFlags(t *testing.T, env Env) {
	ctx := context.Background()
	const history = 12
	AppendN(t, env.Store, 0, history)
	for _, kind := range replayFlagKinds {
		var f replayFlags
		cfg := projection.Config{BatchSize: 5}
		v1, err := projection.New("flags_"+kind.name, cfg, kind.handler(&f, 1))
		require.NoError(t, err)
		cfg.Version = 2
		v2, err := projection.New("flags_"+kind.name, cfg, kind.handler(&f, 2))
		require.NoError(t, err)
		r1, err := projection.NewRunner(env.Backend, projection.RunnerConfig{Logger: testlog.New(t)}, v1)
		require.NoError(t, err)
		if err := r1.Init(ctx); v1.Transactional() && err != nil {
			require.ErrorIs(t, err, projection.ErrNeedsTransaction, kind.name)
			continue
		}
		_, err = r1.CatchUp(ctx, v1.Name())
		require.NoError(t, err, kind.name)
		both, err := projection.NewRunner(env.Backend, projection.RunnerConfig{Logger: testlog.New(t)}, v1, v2)
		require.NoError(t, err)
		require.NoError(t, both.Init(ctx))
		res, err := both.CatchUp(ctx, v2.Name())
		require.NoError(t, err, kind.name)
		require.True(t, res.Activated, "%s: version 2 cut over", kind.name)

		f.mu.Lock()
		require.Len(t, f.seen, history, "%s: version 2 handled the history once", kind.name)
		for i, got := range f.seen {
			require.Equal(t, flagPair{replay: true, replaying: true}, got,
				"%s: history event %d: Event.Replay and Replaying(ctx) are both true", kind.name, i)
		}
		f.mu.Unlock()
	}
}
