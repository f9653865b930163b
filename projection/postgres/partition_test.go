package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
)

// orderEvent is the payload of the partition tests' events.
type orderEvent struct {
	Stream string `json:"stream"`
	V      int64  `json:"v"`
}

// exactlyOnceOrders is a partitioned projection whose read model (orders_seen) refuses a
// duplicate (primary key) and an event applied out of its stream's order (the handler checks
// the stream's previous version is there): either fails the batch.
func exactlyOnceOrders(t *testing.T, partitions int) *projection.Projection {
	t.Helper()
	p, err := projection.New("orders", projection.Config{
		Partitions: partitions,
		BatchSize:  5,
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders_seen (stream text, version bigint, PRIMARY KEY (stream, version))`)
			return err
		},
	}, projection.On("S", func(ctx context.Context, tx pgx.Tx, e projection.Event[orderEvent]) error {
		var last int64
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM orders_seen WHERE stream = $1`, e.StreamID).Scan(&last); err != nil {
			return err
		}
		if last != e.StreamVersion-1 {
			return fmt.Errorf("stream %s: version %d after %d", e.StreamID, e.StreamVersion, last)
		}
		_, err := tx.Exec(ctx, `INSERT INTO orders_seen (stream, version) VALUES ($1, $2)`, e.StreamID, e.StreamVersion)
		return err
	}))
	require.NoError(t, err)
	return p
}

// TestPartitionedExactlyOnce: while events of 32 streams are appended, two runners (two
// workers) catch up each of 4 partitions from goroutines of their own, all at once. The read
// model gets every event once, each stream in version order, in the batches' transactions.
func TestPartitionedExactlyOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testwait.Context(t, 2*time.Minute)
	const streams, rounds, partitions = 32, 8, 4
	runners := []*projection.Runner{runner(t, e.backend, exactlyOnceOrders(t, partitions)), runner(t, e.backend, exactlyOnceOrders(t, partitions))}

	var (
		done atomic.Bool
		last eventstore.Position
		wg   sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer done.Store(true)
		for v := 1; v <= rounds; v++ {
			for s := range streams {
				id := fmt.Sprintf("order-%d", s)
				data, err := eventstore.NewEventData("S", orderEvent{Stream: id, V: int64(v)})
				if err != nil {
					t.Error(err)
					return
				}
				res, err := e.store.Append(ctx, id, eventstore.Exact(int64(v-1)), data)
				if err != nil {
					t.Error(err)
					return
				}
				last = res.Last()
			}
		}
	}()
	for _, r := range runners {
		for k := range partitions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !done.Load() {
					if _, err := r.CatchUpPartition(ctx, "orders", k); err != nil {
						t.Errorf("partition %d: %v", k, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	require.False(t, t.Failed())
	storetest.Settle(t, e.store, last)
	_, err := runners[0].CatchUp(ctx, "orders")
	require.NoError(t, err)

	var rows, distinct, full int
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT stream),
		count(*) FILTER (WHERE version = `+fmt.Sprint(rounds)+`) FROM orders_seen`).Scan(&rows, &distinct, &full))
	require.Equal(t, streams*rounds, rows, "every event once")
	require.Equal(t, streams, distinct)
	require.Equal(t, streams, full)
	st, err := runners[1].Status(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, int64(streams*rounds), st.EventsProcessed)
	require.Zero(t, st.LagEvents)
	require.Equal(t, projection.StateRunning, st.State)
}

// TestPartitionRowsAndConditions: each partition has a status row of its own, which records
// its partition; StatusOf computes a partition's lag in its partition, and the view
// nudge_projection_conditions looks at the partition's streams only.
func TestPartitionRowsAndConditions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testwait.Context(t, time.Minute)
	r := runner(t, e.backend, exactlyOnceOrders(t, 2))
	var indexed bool
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT to_regclass('nudge_events_partition_2_idx') IS NOT NULL`).Scan(&indexed))
	require.True(t, indexed, "Init builds the store's index of 2 partitions")
	var last eventstore.Position
	count := [2]int64{}
	for s := range 12 {
		id := fmt.Sprintf("order-%d", s)
		data, err := eventstore.NewEventData("S", orderEvent{Stream: id, V: 1})
		require.NoError(t, err)
		res, err := e.store.Append(ctx, id, eventstore.NoStream, data)
		require.NoError(t, err)
		last = res.Last()
		count[eventstore.PartitionOf(id, 2)]++
	}
	require.Positive(t, count[0])
	require.Positive(t, count[1])
	storetest.Settle(t, e.store, last)
	_, err := r.CatchUpPartition(ctx, "orders", 0)
	require.NoError(t, err)

	rows, err := e.db.Pool.Query(ctx, `SELECT name, partition_of, partition_index, partition_count FROM nudge_projections ORDER BY name`)
	require.NoError(t, err)
	type row struct {
		Name, Of     string
		Index, Count int
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	require.Equal(t, []row{{"orders.p0", "orders", 0, 2}, {"orders.p1", "orders", 1, 2}}, got)

	p0, err := e.backend.StatusOf(ctx, "orders.p0")
	require.NoError(t, err)
	require.Zero(t, p0.LagEvents)
	p1, err := e.backend.StatusOf(ctx, "orders.p1")
	require.NoError(t, err)
	require.Equal(t, count[1], p1.LagEvents)
	all, err := e.backend.Statuses(ctx)
	require.NoError(t, err)
	require.Len(t, all, 2)
	require.Zero(t, all[0].LagEvents)
	require.Equal(t, count[1], all[1].LagEvents)
	require.Equal(t, "orders", all[1].PartitionOf)
	require.Equal(t, eventstore.Partition{Index: 1, Count: 2}, all[1].Partition)
	folded, err := e.backend.StatusOf(ctx, "orders")
	require.NoError(t, err, "the projection's own name folds its partitions")
	require.Len(t, folded.Partitions, 2)
	require.Equal(t, count[1], folded.LagEvents)
	require.Equal(t, count[0], folded.EventsProcessed)
	_, err = e.backend.StatusOf(ctx, "nope")
	require.ErrorIs(t, err, projection.ErrNotRegistered)

	conditions := map[string]string{}
	crows, err := e.db.Pool.Query(ctx, `SELECT name, condition FROM nudge_projection_conditions`)
	require.NoError(t, err)
	for crows.Next() {
		var name, cond string
		require.NoError(t, crows.Scan(&name, &cond))
		conditions[name] = cond
	}
	require.NoError(t, crows.Err())
	require.Equal(t, "working", conditions["orders.p1"])
	require.Contains(t, []string{"caught_up", "held"}, conditions["orders.p0"], "partition 0 does not wait for partition 1's events")
}
