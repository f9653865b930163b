package postgres

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// TestPartitionLagReadsThePartitionIndex: the lag statement of a partition walks the store's
// index of its partition count (from the position, and backwards for "held"), never the whole
// events table, so the status of N partitions reads each partition's window only.
func TestPartitionLagReadsThePartitionIndex(t *testing.T) {
	t.Parallel()
	ctx := testwait.Context(t, time.Minute)
	db := pgtest.New(t)
	store, err := espg.New(db.Pool, espg.Config{})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	b, err := New(store)
	require.NoError(t, err)
	require.NoError(t, b.Migrate(ctx))
	for s := range 50 {
		var batch []eventstore.EventData
		for range 40 {
			data, err := eventstore.NewEventData("S", map[string]int{"s": s})
			require.NoError(t, err)
			batch = append(batch, data)
		}
		_, err := store.Append(ctx, fmt.Sprintf("order-%d", s), eventstore.Any, batch...)
		require.NoError(t, err)
	}
	require.NoError(t, b.EnsurePartitions(ctx, 16))
	_, err = db.Pool.Exec(ctx, `ANALYZE nudge_events`)
	require.NoError(t, err)

	for _, types := range [][]string{nil, {"S"}} {
		var plan []string
		err := pgx.BeginTxFunc(ctx, db.Pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sortOff); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, `EXPLAIN `+b.partitions.forCount(16), uint64(0), int64(0), types, 3)
			if err != nil {
				return err
			}
			plan, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return err
		})
		require.NoError(t, err)
		text := strings.Join(plan, "\n")
		require.Contains(t, text, "nudge_events_partition_16_idx", "types %v: %s", types, text)
		require.NotContains(t, text, "Seq Scan on nudge_events", "types %v: %s", types, text)
		require.NotContains(t, text, "Sort", "types %v: %s", types, text)
	}

	var want int64
	for s := range 50 {
		if eventstore.PartitionOf(fmt.Sprintf("order-%d", s), 16) == 3 {
			want += 40
		}
	}
	// The appends are committed, but a transaction open elsewhere on the server (another
	// test's) may hold some of them behind the read horizon for a moment.
	require.Eventually(t, func() bool {
		l, err := b.partitionLag(ctx, eventstore.Position{}, rowInfo{part: eventstore.Partition{Index: 3, Count: 16}})
		require.NoError(t, err)
		return l.events == want
	}, testwait.For(30*time.Second), 10*time.Millisecond, "partition 3's lag counts its streams' events")
}
