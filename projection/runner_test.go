package projection_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	memstore "github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/memory"
	"github.com/nudgeworks/nudge/projection/projectiontest"
)

// TestMaxBatchDurationEndsBatchesEarly: a batch that has been handling events for longer than
// MaxBatchDuration commits what it has, to keep transactions short.
func TestMaxBatchDurationEndsBatchesEarly(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	backend, err := memory.New(store, memory.Config{})
	require.NoError(t, err)
	projectiontest.AppendN(t, store, 0, 100, "A")

	// Every reading of the clock advances it by a second.
	var ticks atomic.Int64
	now := func() time.Time { return time.Unix(ticks.Add(1), 0) }
	rec := projectiontest.NewRecorder()
	p, err := projection.New("slow", projection.Config{BatchSize: 100, MaxBatchDuration: 3500 * time.Millisecond},
		projection.OnIdempotent("A", rec.Handle))
	require.NoError(t, err)
	r, err := projection.NewRunner(backend, projection.RunnerConfig{NowFunc: now, Logger: testlog.New(t)}, p)
	require.NoError(t, err)
	require.NoError(t, r.Init(context.Background()))

	res, err := r.CatchUp(context.Background(), "slow")
	require.NoError(t, err)
	require.Equal(t, 100, res.Events)
	require.Greater(t, res.Batches, 10, "batches were cut short by time, not by size")
	require.Equal(t, 100, rec.Calls(), "nothing handled twice")
}

// TestOnBatchReportsCommittedAndFailedBatches: the OnBatch hook sees every batch that committed
// events, and a failed one with its *HandlerError, after the good prefix was committed.
func TestOnBatchReportsCommittedAndFailedBatches(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	backend, err := memory.New(store, memory.Config{})
	require.NoError(t, err)
	projectiontest.AppendN(t, store, 0, 25, "A")
	projectiontest.AppendN(t, store, 25, 1, "Bad")

	var reports []projection.BatchReport
	p, err := projection.New("reported", projection.Config{BatchSize: 10},
		projection.OnIdempotent("A", func(context.Context, projection.Event[map[string]any]) error { return nil }),
		projection.OnIdempotent("Bad", func(context.Context, projection.Event[map[string]any]) error { return errors.New("boom") }))
	require.NoError(t, err)
	r, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: testlog.New(t), OnBatch: func(b projection.BatchReport) { reports = append(reports, b) }}, p)
	require.NoError(t, err)
	require.NoError(t, r.Init(context.Background()))

	_, err = r.CatchUp(context.Background(), "reported")
	require.ErrorIs(t, err, projection.ErrHandler)
	var events []int
	for _, b := range reports[:len(reports)-1] {
		require.NoError(t, b.Err)
		require.Equal(t, "reported", b.Projection)
		events = append(events, b.Events)
	}
	require.Equal(t, []int{10, 10, 5}, events, "two full batches, then the good prefix of the failing one")
	last := reports[len(reports)-1]
	require.ErrorIs(t, last.Err, projection.ErrHandler)
	require.Zero(t, last.Events)
	require.Equal(t, reports[len(reports)-2].Position, last.Position, "the failure reports the position it stopped at")
}
