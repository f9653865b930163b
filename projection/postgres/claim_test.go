package postgres_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/postgres"
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
	v2 := lastV2(t, cfg, func(context.Context, projection.Event[appended]) error {
		time.Sleep(cost) // the handler's known cost per event
		return nil
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
	rounds, timedOut := 0, 0
	for ; !res.Activated && ctx.Err() == nil; rounds++ {
		res, err = neu.CatchUp(ctx, v2.Name())
		if errors.Is(err, projection.ErrBatchTimeout) {
			// A batch, or the cut-over, slowed past its 300 ms by a busy machine: retried, as
			// a worker would.
			timedOut++
			continue
		}
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
	t.Logf("cut-over past a stopped version 1 (%d events behind it, BatchTimeout %s): %d catch-up(s), %d timed out, the cut-over held the locks %s; "+
		"a reader of the stable view: longest query overlapping the cut-over %s (%d queries), longest while version 2 built %s (%d queries)",
		backlog, timeout, rounds, timedOut, res.CutOverHeld, atFlip, n, all, len(queries))
	require.Positive(t, n, "the reader queried during the cut-over")
	require.Less(t, res.CutOverHeld, timeout)

	got, err := readModel(ctx, e.db.Pool)
	require.NoError(t, err)
	require.Equal(t, history+backlog, got, "readers see every event in version 2's model")
}

// TestClaimWaitsForABusyActiveVersion forces the interleaving that kept a building version
// from ever cutting over while its active version lagged: the building partition is level
// with the active version, and a batch of an active partition it must claim past is in flight
// (held inside its handler) when the building partition's batch reads past the active
// version's position. The claim waits for that lock (seen waiting in pg_locks) instead of
// giving up at once; once the active batch commits, the building partition claims the events
// after the active version's new position and handles them live. Every event still has its
// side effect once.
func TestClaimWaitsForABusyActiveVersion(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	postgres.SetClaimWait(e.backend, testwait.For(time.Minute)) // the release below must not race the bound
	ctx := context.WithValue(testwait.Context(t, 3*time.Minute), poolKey{}, e.db.Pool)
	const (
		history = 60
		live    = 80
		heldK   = 65
	)
	hold, entered, release := holdAt(heldK)
	v1, v2 := partitionedMailer(t, 1, 2, hold), partitionedMailer(t, 2, 3, nil) // each new partition is bound by both old ones
	r := runner(t, e.backend, v1)
	appendSettled(ctx, t, e, 1, history, false)
	_, err := r.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	both := runner(t, e.backend, v1, v2)
	res, err := both.CatchUpPartition(ctx, v2.Name(), 0) // level with version 1: history only
	require.NoError(t, err)
	require.False(t, res.Activated, "the other new partitions have history left")
	appendSettled(ctx, t, e, history+1, live, false)

	var (
		wg                sync.WaitGroup
		heldErr, claimErr error
		claimDone         atomic.Bool
		held              = eventstore.PartitionOf(streamOf(heldK), 2)
	)
	wg.Go(func() { _, heldErr = both.CatchUpPartition(ctx, v1.Name(), held) })
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the active partition's batch did not reach the held event")
	}
	wg.Go(func() {
		defer claimDone.Store(true)
		_, claimErr = both.CatchUpPartition(ctx, v2.Name(), 0)
	})
	waited := false
	require.Eventually(t, func() bool {
		var waiting int
		// The claim's statement, not the cut-over's, waits for the lock.
		require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
			WHERE l.locktype = 'advisory' AND NOT l.granted AND a.datname = current_database()
				AND a.query LIKE '%count(pg_advisory_xact_lock(%'`).Scan(&waiting))
		waited = waiting > 0
		return waited || claimDone.Load()
	}, testwait.For(time.Minute), 5*time.Millisecond)
	release()
	wg.Wait()
	require.NoError(t, heldErr)
	require.NoError(t, claimErr)
	require.True(t, waited, "the new partition's claim waited for the busy active partition's lock")
	var claimed int
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM sink WHERE version = 2`).Scan(&claimed))
	require.Positive(t, claimed, "the new partition claimed live events past the active version's position")

	// Both versions to the end: the cut-over, then version 1 retires.
	for k := range 3 {
		_, err = both.CatchUpPartition(ctx, v2.Name(), k)
		require.NoError(t, err)
	}
	for k := range 2 {
		_, err = both.CatchUpPartition(ctx, v1.Name(), k)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		res, err := both.CatchUp(ctx, v2.Name())
		require.NoError(t, err)
		st, err := both.Status(ctx, v2.Name())
		require.NoError(t, err)
		return res.Activated || st.VersionState == projection.VersionActive
	}, testwait.For(time.Minute), 10*time.Millisecond, "version 2 cuts over")
	var total, distinct int
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM sink`).Scan(&total, &distinct))
	require.Equal(t, live, distinct, "every event had its side effect")
	require.Equal(t, live, total, "no event had it twice")
}
