package projection_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	memstore "github.com/nudgeworks/nudge/eventstore/memory"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/memory"
	"github.com/nudgeworks/nudge/projection/projectiontest"
)

// TestMaxBatchDurationEndsBatchesEarly: a batch that has been handling events for longer than
// MaxBatchDuration commits what it has, to keep transactions short.
func TestMaxBatchDurationEndsBatchesEarly(t *testing.T) {
	t.Parallel()
	store := memstore.New(memstore.Config{})
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
	r, err := projection.NewRunner(backend, projection.RunnerConfig{NowFunc: now}, p)
	require.NoError(t, err)
	require.NoError(t, r.Init(context.Background()))

	res, err := r.CatchUp(context.Background(), "slow")
	require.NoError(t, err)
	require.Equal(t, 100, res.Events)
	require.Greater(t, res.Batches, 10, "batches were cut short by time, not by size")
	require.Equal(t, 100, rec.Calls(), "nothing handled twice")
}
