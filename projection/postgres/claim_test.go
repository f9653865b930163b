package postgres_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
)

// query is one of the reader's queries: when it started, how long it took.
type query struct {
	start time.Time
	took  time.Duration
}

// TestBlueGreenCutOverPastAStoppedActive: version 1's worker stops while events are appended,
// several BatchTimeouts' worth of version 2's work (a known cost per event). Version 2 builds
// past version 1's frozen position in ordinary batches, claiming those events, and cuts over
// in a short transaction. A reader queries the stable view in a loop all along; the test logs
// its longest query around the flip with the cut-over's lock time.
func TestBlueGreenCutOverPastAStoppedActive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testwait.Context(t, 3*time.Minute)
	const (
		timeout = 300 * time.Millisecond
		cost    = 500 * time.Microsecond
		history = 200
		backlog = 1800 // 900 ms of version 2's handlers at least: three BatchTimeouts
	)
	cfg := projection.Config{BatchSize: 25, BatchTimeout: timeout, MaxBatchDuration: timeout / 2}
	v1 := lastV1(t, cfg)
	old := runner(t, e.backend, v1)
	appendSettled(ctx, t, e, 1, history, false)
	_, err := old.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	// Version 1's worker stops here.
	appendSettled(ctx, t, e, history+1, history+backlog, false)
	v2 := lastV2(t, cfg, func(projection.Event[appended]) bool {
		time.Sleep(cost) // the handler's known cost per event
		return false
	})
	var lastReport atomic.Int64 // when the last batch (the cut-over, at the end) was reported
	neu, err := projection.NewRunner(e.backend, projection.RunnerConfig{Logger: testlog.New(t), OnBatch: func(projection.BatchReport) {
		lastReport.Store(time.Now().UnixNano())
	}}, v2)
	require.NoError(t, err)
	require.NoError(t, neu.Init(ctx))

	var (
		stop    = make(chan struct{})
		done    = make(chan error, 1)
		mu      sync.Mutex
		queries []query
	)
	go func() { // the reader: the stable view, in a loop
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			start := time.Now()
			var n int
			if err := e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+lastTable).Scan(&n); err != nil {
				done <- err
				return
			}
			mu.Lock()
			queries = append(queries, query{start, time.Since(start)})
			mu.Unlock()
		}
	}()
	var res projection.Result
	rounds := 0
	for ; rounds < 5 && !res.Activated; rounds++ {
		res, err = neu.CatchUp(ctx, v2.Name())
		require.NoError(t, err)
	}
	close(stop)
	require.NoError(t, <-done)
	require.True(t, res.Activated, "version 2 cut over")
	flipEnd := time.Unix(0, lastReport.Load())
	flipStart := flipEnd.Add(-res.CutOverHeld)
	var atFlip, all time.Duration
	n := 0
	for _, q := range queries {
		all = max(all, q.took)
		if q.start.Before(flipEnd) && q.start.Add(q.took).After(flipStart) {
			atFlip, n = max(atFlip, q.took), n+1
		}
	}
	t.Logf("cut-over past a stopped version 1 (%d events behind it, BatchTimeout %s): %d catch-up(s), the cut-over held the locks %s; "+
		"a reader of the stable view: longest query overlapping the cut-over %s (%d queries), longest while version 2 built %s (%d queries)",
		backlog, timeout, rounds, res.CutOverHeld, atFlip, n, all, len(queries))
	require.Positive(t, n, "the reader queried during the cut-over")
	require.Less(t, res.CutOverHeld, timeout)

	got, err := readModel(ctx, e.db.Pool)
	require.NoError(t, err)
	require.Equal(t, history+backlog, got, "readers see every event in version 2's model")
}
