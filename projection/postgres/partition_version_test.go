package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
)

// partitionedMailer is version version of a partitioned projection with an at-least-once side
// effect (a row per live event in sink) that skips history; hold, when set, runs first in the
// handler.
func partitionedMailer(t *testing.T, version, partitions int, hold func(ctx context.Context, k int) error) *projection.Projection {
	t.Helper()
	p, err := projection.New("pmailer", projection.Config{
		Version:    version,
		Partitions: partitions,
		BatchSize:  10,
		InitFunc: func(ctx context.Context, hp projection.HookParams) error {
			_, err := hp.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS sink (event_id uuid NOT NULL, version int NOT NULL)`)
			return err
		},
	}, projection.OnIdempotent("Appended", func(ctx context.Context, e projection.Event[appended]) error {
		if hold != nil {
			if err := hold(ctx, e.Data.K); err != nil {
				return err
			}
		}
		if e.Replay {
			return nil
		}
		_, err := pool(ctx).Exec(ctx, `INSERT INTO sink (event_id, version) VALUES ($1, $2)`, e.ID, version)
		return err
	}))
	require.NoError(t, err)
	return p
}

// holdAt returns a hold for partitionedMailer that holds the handler of event k inside its
// batch: entered closes when the handler reaches it, and release lets it (and any later) go.
func holdAt(k int) (hold func(ctx context.Context, k int) error, entered <-chan struct{}, release func()) {
	var (
		reached  = make(chan struct{})
		released = make(chan struct{})
		once     sync.Once
	)
	hold = func(ctx context.Context, n int) error {
		if n != k {
			return nil
		}
		once.Do(func() { close(reached) })
		select {
		case <-released:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return hold, reached, func() { close(released) }
}

// TestPartitionedCutOverWaitsForActiveBatch forces the interleaving the cut-over of a
// partitioned version must survive: a batch of an active partition is in flight (held inside
// its handler) when the new version, level with what the active version has committed, tries
// to cut over. The cut-over waits for that partition's lock (seen waiting in pg_locks), and
// once the batch commits it counts the events the batch handled as history: every event has
// its side effect once, in one version or the other.
func TestPartitionedCutOverWaitsForActiveBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.WithValue(testwait.Context(t, 3*time.Minute), poolKey{}, e.db.Pool)
	const heldK = 45
	hold, entered, release := holdAt(heldK)
	v1, v2 := partitionedMailer(t, 1, 2, hold), partitionedMailer(t, 2, 3, nil) // counts without a common divisor: each new partition is bound by both old ones
	r := runner(t, e.backend, v1)
	appendSettled(ctx, t, e, 1, 40, false)
	_, err := r.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	both := runner(t, e.backend, v1, v2)
	appendSettled(ctx, t, e, 41, 60, false)

	var (
		wg               sync.WaitGroup
		heldErr, flipErr error
	)
	held := eventstore.PartitionOf(streamOf(heldK), 2)
	wg.Go(func() { _, heldErr = both.CatchUpPartition(ctx, v1.Name(), held) })
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the active partition's batch did not reach the held event")
	}
	var res projection.Result
	wg.Go(func() { res, flipErr = both.CatchUp(ctx, v2.Name()) })
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&waiting))
		return waiting > 0
	}, testwait.For(time.Minute), 5*time.Millisecond, "the cut-over waits for the held partition's lock")
	st, err := both.Status(ctx, v2.Name())
	require.NoError(t, err)
	require.Equal(t, projection.VersionBuilding, st.VersionState, "not cut over while the active batch is in flight")
	release()
	wg.Wait()
	require.NoError(t, heldErr)
	require.NoError(t, flipErr)
	require.True(t, res.Activated)

	appendSettled(ctx, t, e, 61, 70, false)
	res, err = both.CatchUp(ctx, v1.Name())
	require.NoError(t, err)
	require.True(t, res.Retired)
	_, err = both.CatchUp(ctx, v2.Name())
	require.NoError(t, err)
	var total, distinct, byV1 int
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id), count(*) FILTER (WHERE version = 1) FROM sink`).
		Scan(&total, &distinct, &byV1))
	require.Equal(t, 70, distinct, "every event had its side effect")
	require.Equal(t, 70, total, "no event had it twice")
	require.Greater(t, byV1, 40, "the held batch committed events of version 1 before the cut-over")
}
