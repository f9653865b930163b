package worker_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/projectiontest"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/trigger"
	"github.com/nudgeworks/nudge/worker"
)

// logRecorder is a slog.Handler that keeps the messages of the records it gets, so a test can
// wait for a log line as a signal.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	return nil
}

func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

// count returns how many records had the message msg.
func (l *logRecorder) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

// rebuildable is s.model with a reset hook that empties the table and counts its runs.
func (s *setup) rebuildable(t testing.TB, name string, resets *atomic.Int64, resetErr error) *projection.Projection {
	t.Helper()
	table := pgx.Identifier{name + "_model"}.Sanitize()
	p, err := projection.New(name, projection.Config{
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (n int PRIMARY KEY, times int NOT NULL)`)
			return err
		},
		ResetFunc: func(ctx context.Context, p projection.HookParams) error {
			if resetErr != nil {
				return resetErr
			}
			resets.Add(1)
			_, err := p.Tx.Exec(ctx, `TRUNCATE `+table)
			return err
		},
	}, projection.On("A", func(ctx context.Context, tx pgx.Tx, e projection.Event[projectiontest.Payload]) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, 1) ON CONFLICT (n) DO UPDATE SET times = `+table+`.times + 1`, e.Data.N)
		return err
	}))
	require.NoError(t, err)
	return p
}

// dbNow is the database's clock, which stamps RebuildStartedAt: rebuild requests take their
// time from it.
func (s *setup) dbNow(t testing.TB) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, s.db.Pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now))
	return now
}

// Log lines of the worker's rebuild branch the tests wait on.
const (
	logRebuildReset = "rebuild request: projection reset, rebuilding"
	logRebuildDone  = "rebuild request already carried out; catching up"
)

// TestRebuildRequest: a rebuild trigger makes the projection's worker run its reset hook and
// rebuild the read model from the start; a second delivery of the same request does not reset
// again (its time is before the rebuild's start) but only catches up; a later request rebuilds
// again. On every channel.
func TestRebuildRequest(t *testing.T) {
	t.Parallel()
	eachChannel(t, func(t *testing.T, s *setup, ch channel.Channel) {
		logs := &logRecorder{}
		s.logger = slog.New(logs)
		var resets atomic.Int64
		p := s.rebuildable(t, "rebuilt", &resets, nil)
		w := s.start(t, ch, worker.Config{SafetyNetInterval: -1}, p)
		for n := 1; n <= 5; n++ {
			s.append(t, "s", storeEvent(n))
		}
		require.Eventually(t, func() bool { rows, _ := s.count(t, "rebuilt"); return rows == 5 }, eventually, 5*time.Millisecond)
		runner, err := projection.NewRunner(s.backend, projection.RunnerConfig{Logger: s.logger}, p)
		require.NoError(t, err)
		ctx := context.Background()
		status := func() projection.Status {
			st, err := runner.Status(ctx, "rebuilt")
			require.NoError(t, err)
			return st
		}
		require.True(t, status().RebuildStartedAt.IsZero())

		// Mark every row, to see that the rebuild wrote them all again.
		_, err = s.db.Pool.Exec(ctx, `UPDATE rebuilt_model SET times = 100`)
		require.NoError(t, err)
		req := trigger.Trigger{Projection: "rebuilt", Reason: trigger.ReasonRebuild, At: s.dbNow(t), Rebuild: &trigger.RebuildRequest{By: "ann"}}
		require.NoError(t, ch.Publish(ctx, req))
		var st projection.Status
		require.Eventually(t, func() bool {
			st = status()
			return st.RebuildStartedAt.After(req.At) && st.State == projection.StateRunning && st.CaughtUp()
		}, eventually, 5*time.Millisecond)
		require.Equal(t, int64(1), resets.Load(), "the projection's own reset hook ran once")
		rows, wrong := s.count(t, "rebuilt")
		require.Equal(t, 5, rows)
		require.Zero(t, wrong, "every row was written again, once, by the rebuild")
		require.Equal(t, int64(5), st.EventsProcessed)
		require.Equal(t, 1, logs.count(logRebuildReset))
		started := st.RebuildStartedAt

		// The same request again, as a broker redelivers it: no second reset.
		received := w.Stats("rebuilt").Received
		require.NoError(t, ch.Publish(ctx, req))
		require.Eventually(t, func() bool { return logs.count(logRebuildDone) == 1 }, eventually, 5*time.Millisecond,
			"the redelivered request is handled")
		require.Greater(t, w.Stats("rebuilt").Received, received)
		require.Equal(t, int64(1), resets.Load(), "a redelivered request does not reset again")
		st = status()
		require.True(t, st.RebuildStartedAt.Equal(started), "the rebuild did not start again")
		require.Equal(t, int64(5), st.EventsProcessed)
		require.Equal(t, 1, logs.count(logRebuildReset))

		// A new request rebuilds again.
		later := req
		later.At = s.dbNow(t)
		require.NoError(t, ch.Publish(ctx, later))
		require.Eventually(t, func() bool {
			st = status()
			return st.RebuildStartedAt.After(later.At) && st.State == projection.StateRunning && st.CaughtUp()
		}, eventually, 5*time.Millisecond)
		require.Equal(t, int64(2), resets.Load())
		require.Equal(t, 2, logs.count(logRebuildReset))
	})
}

// TestRebuildRequestResetFails: a reset hook that fails leaves the projection as it was and
// dead-letters the request at once, with the hook's error, instead of retrying it.
func TestRebuildRequestResetFails(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ch := s.newChannel(t, channels["gochannel"])
	ctx := context.Background()
	require.NoError(t, ch.Declare(ctx, "stuck"))

	var resets atomic.Int64
	// A retry would come after an hour: a dead letter within the test's wait came at once.
	w := s.start(t, ch, worker.Config{SafetyNetInterval: -1, Retry: retry.Policy{InitialInterval: time.Hour, MaxInterval: time.Hour, MaxElapsedTime: -1}},
		s.rebuildable(t, "stuck", &resets, errors.New("the search index is read-only")))
	s.append(t, "s", storeEvent(1))
	require.Eventually(t, func() bool { return s.has(t, "stuck", 1) }, eventually, 5*time.Millisecond)

	require.NoError(t, ch.Publish(ctx, trigger.Trigger{Projection: "stuck", Reason: trigger.ReasonRebuild, At: s.dbNow(t)}))
	rec := s.awaitDeadLetters(t, 1)[0] // at once: a retry would take an hour
	require.Contains(t, rec.Error, "the search index is read-only")
	tr, err := trigger.Decode(rec.Payload)
	require.NoError(t, err)
	require.Equal(t, trigger.ReasonRebuild, tr.Reason, "the request itself is kept")
	// The counter moves right after the dead letter is stored.
	require.Eventually(t, func() bool { return w.Stats("stuck").DeadLettered == 1 }, eventually, 5*time.Millisecond)
	require.True(t, s.has(t, "stuck", 1), "the read model is untouched")
	runner, err := projection.NewRunner(s.backend, projection.RunnerConfig{Logger: s.logger},
		s.rebuildable(t, "stuck", &resets, nil))
	require.NoError(t, err)
	st, err := runner.Status(ctx, "stuck")
	require.NoError(t, err)
	require.True(t, st.RebuildStartedAt.IsZero())
	require.Equal(t, projection.StateRunning, st.State)
}
