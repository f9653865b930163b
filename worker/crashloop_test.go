package worker_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/deadletter"
	dlpg "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/projectiontest"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/trigger"
	"github.com/nudgeworks/nudge/worker"
)

// TestDeployClearsCrashLoopBeforeQueuedTriggers: a projection was judged to kill the process on
// one event (the crash-loop verdict) and dead-lettered; 50 triggers queued up behind it while no
// worker ran; the fixed version starts. Its start-up replay clears the verdict before any of
// the queued triggers is handled, so none of them meets it: the record is replayed, its count
// unchanged, no new dead letter, no warning, and the projection catches up. With Run and with
// the handlers on the service's own router, on RabbitMQ and on the PostgreSQL queue.
func TestDeployClearsCrashLoopBeforeQueuedTriggers(t *testing.T) {
	t.Parallel()
	for _, channelName := range []string{"amqp", "postgres"} {
		for _, how := range []string{"run", "own-router"} {
			t.Run(channelName+"/"+how, func(t *testing.T) {
				t.Parallel()
				deployClearsCrashLoop(t, channelName, how == "own-router")
			})
		}
	}
}

const (
	crashyEvents = 5
	crashyPoison = 3  // the event the process "died" on
	crashyQueued = 50 // triggers queued while no worker ran
)

func deployClearsCrashLoop(t *testing.T, channelName string, own bool) {
	ctx := context.Background()
	s := newSetup(t)
	s.ownRouter = own
	ch := s.newChannel(t, channels[channelName])
	t.Cleanup(func() { require.NoError(t, ch.Close()) })
	dead, err := dlpg.New(s.db.Pool, dlpg.Config{})
	require.NoError(t, err)
	require.NoError(t, dead.Migrate(ctx))
	cfg := worker.Config{
		SafetyNetInterval: -1, // only triggers and the start-up replay move the projection here
		Retry:             retry.Policy{MaxAttempts: 2, InitialInterval: 10 * time.Millisecond, MaxInterval: 20 * time.Millisecond},
		DeadLetters:       dead,
	}
	p := crashyProjection(t)
	res := reachCrashLoopVerdict(t, s, p)

	// The old version: a trigger meets the verdict and is dead-lettered.
	w, stop := s.startStoppable(t, ch, cfg, p)
	require.NoError(t, ch.Publish(ctx, trigger.ForAppend(res, time.Now())))
	require.Eventually(t, func() bool { return w.Stats("crashy").DeadLettered > 0 }, eventually, 5*time.Millisecond)
	stop()
	before := crashyRecords(t, dead)
	require.Len(t, before, 1)
	require.Equal(t, deadletter.StatusFailed, before[0].Status)
	require.Contains(t, before[0].Error, "the process stopped")

	// Triggers queue up while no worker runs (appends go on elsewhere, say).
	for range crashyQueued {
		require.NoError(t, ch.Publish(ctx, trigger.ForAppend(res, time.Now())))
	}

	// The fixed version starts.
	logs := newLevelRecorder(testlog.New(t).Handler())
	s.logger = slog.New(logs)
	w, stop = s.startStoppable(t, ch, cfg, crashyProjection(t))
	defer stop()
	require.Eventually(t, func() bool {
		rows, _ := s.count(t, "crashy")
		return rows == crashyEvents && w.Stats("crashy").Received >= crashyQueued+1 // the queue and the replay's trigger
	}, eventually, 5*time.Millisecond, "the projection catches up and the queued triggers are handled")
	rows, wrong := s.count(t, "crashy")
	require.Equal(t, crashyEvents, rows)
	require.Zero(t, wrong, "each event handled once")

	after := crashyRecords(t, dead)
	t.Logf("records %d, count %d → %d, status %s, dead-lettered %d, warnings %d", len(after), before[0].Count, after[0].Count,
		after[0].Status, w.Stats("crashy").DeadLettered, len(logs.warnings()))
	require.Len(t, after, 1, "no new dead letter")
	require.Equal(t, deadletter.StatusReplayed, after[0].Status, "the start-up replay marked the record replayed")
	require.Equal(t, before[0].Count, after[0].Count, "no queued trigger folded into the record")
	require.Zero(t, w.Stats("crashy").DeadLettered)
	require.Empty(t, logs.warnings(), "no warning")
}

// crashyProjection records every event once in crashy_model; its handler is the fixed one (the
// process deaths are left behind by reachCrashLoopVerdict).
func crashyProjection(t testing.TB) *projection.Projection {
	t.Helper()
	p, err := projection.New("crashy", projection.Config{
		CrashLoopLimit: 2,
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS crashy_model (n int PRIMARY KEY, times int NOT NULL)`)
			return err
		},
	}, projection.On("A", func(ctx context.Context, tx pgx.Tx, e projection.Event[projectiontest.Payload]) error {
		_, err := tx.Exec(ctx, `INSERT INTO crashy_model VALUES ($1, 1) ON CONFLICT (n) DO UPDATE SET times = crashy_model.times + 1`, e.Data.N)
		return err
	}))
	require.NoError(t, err)
	return p
}

// reachCrashLoopVerdict appends the events, commits those before the poison one and leaves
// behind what processes dying in the poison event's handler leave: batches started there without
// finishing, the last ones one event at a time, up to the limit. The next batch there reaches
// the verdict. It returns the append of the poison event and those after it.
func reachCrashLoopVerdict(t testing.TB, s *setup, p *projection.Projection) eventstore.AppendResult {
	t.Helper()
	ctx := context.Background()
	events := storeEventsN(crashyEvents)
	first, err := s.store.Append(ctx, "c", eventstore.Any, events[:crashyPoison-1]...)
	require.NoError(t, err)
	storetest.Settle(t, s.store, first.Last())
	r, err := projection.NewRunner(s.backend, projection.RunnerConfig{Logger: s.logger}, p)
	require.NoError(t, err)
	require.NoError(t, r.Init(ctx))
	_, err = r.CatchUp(ctx, "crashy")
	require.NoError(t, err)
	at := r.CommittedPosition("crashy")
	require.Equal(t, first.Last(), at)
	res, err := s.store.Append(ctx, "c", eventstore.Any, events[crashyPoison-1:]...)
	require.NoError(t, err)
	_, err = s.backend.StartAttempt(ctx, p, at, res.Events[0].Position)
	require.NoError(t, err)
	_, err = s.backend.StartAttempt(ctx, p, at, eventstore.Position{})
	require.NoError(t, err)
	return res
}

func storeEventsN(n int) []eventstore.EventData {
	out := make([]eventstore.EventData, n)
	for i := range out {
		out[i] = storeEvent(i + 1)
	}
	return out
}

func crashyRecords(t testing.TB, dead deadletter.Store) []deadletter.Record {
	t.Helper()
	recs, err := dead.List(context.Background(), deadletter.Filter{Projection: "crashy"})
	require.NoError(t, err)
	return recs
}

// levelRecorder passes records on to next and keeps those at warning level or above.
type levelRecorder struct {
	next slog.Handler
	mu   *sync.Mutex
	kept *[]string
}

func newLevelRecorder(next slog.Handler) *levelRecorder {
	return &levelRecorder{next: next, mu: &sync.Mutex{}, kept: new([]string)}
}

func (l *levelRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (l *levelRecorder) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		l.mu.Lock()
		*l.kept = append(*l.kept, fmt.Sprintf("%s %s", r.Level, r.Message))
		l.mu.Unlock()
	}
	if l.next.Enabled(ctx, r.Level) {
		return l.next.Handle(ctx, r)
	}
	return nil
}

func (l *levelRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &levelRecorder{next: l.next.WithAttrs(as), mu: l.mu, kept: l.kept}
}

func (l *levelRecorder) WithGroup(g string) slog.Handler {
	return &levelRecorder{next: l.next.WithGroup(g), mu: l.mu, kept: l.kept}
}

func (l *levelRecorder) warnings() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), *l.kept...)
}
