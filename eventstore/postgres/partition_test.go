package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// TestPartitionSQLMatchesGo: PostgreSQL's md5 partitions and eventstore.PartitionOf agree on
// many stream ids (ASCII, accents, CJK, emoji, the longest allowed, quotes and spaces), for
// several counts; and the expression is immutable, so it can be indexed.
func TestPartitionSQLMatchesGo(t *testing.T) {
	t.Parallel()
	_, db := newStore(t, postgres.Config{})
	ctx := context.Background()
	var ids []string
	for i := range 5000 {
		ids = append(ids, fmt.Sprintf("ticket-%d", i), fmt.Sprintf("Kundenkonto-Ü%d-流水-🎫", i))
	}
	ids = append(ids, strings.Repeat("x", eventstore.MaxStreamIDLength), "a b", `it's "quoted"`, `back\slash`)
	for _, count := range []int{2, 7, 16, 1000, 1023, 1024} {
		rows, err := db.Pool.Query(ctx, `SELECT stream_id, `+postgres.PartitionSQL(count)+`
			FROM unnest($1::text[]) AS t(stream_id)`, ids)
		require.NoError(t, err)
		n := 0
		for rows.Next() {
			var (
				id        string
				partition int
			)
			require.NoError(t, rows.Scan(&id, &partition))
			require.Equal(t, eventstore.PartitionOf(id, count), partition, "partition of %q among %d", id, count)
			n++
		}
		require.NoError(t, rows.Err())
		require.Equal(t, len(ids), n)
	}
}

// streamsIn returns n stream ids in partition p.
func streamsIn(p eventstore.Partition, prefix string, n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		if id := fmt.Sprintf("%s-%d", prefix, i); p.Contains(id) {
			out = append(out, id)
		}
	}
	return out
}

// TestPartitionReadHoldsBehindInFlight: a partitioned read keeps the horizon. While a
// transaction that appended to a stream of the partition is open, a later committed event of
// the same partition is not read (nor is it the partition's head); after the commit both are,
// the in-flight one first. It holds for ReadTx as for Read.
func TestPartitionReadHoldsBehindInFlight(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, postgres.Config{})
	ctx := testwait.Context(t, 2*time.Minute)
	p := eventstore.Partition{Index: 2, Count: 4}
	require.NoError(t, s.EnsurePartitions(ctx, p.Count))
	mine := streamsIn(p, "held", 2)
	other := streamsIn(eventstore.Partition{Index: 3, Count: 4}, "other", 1)[0]

	before, err := s.Append(ctx, mine[1], eventstore.NoStream, storetest.Event("A", 0))
	require.NoError(t, err)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	inflight, err := s.AppendTx(ctx, tx, mine[0], eventstore.NoStream, storetest.Event("A", 1))
	require.NoError(t, err)
	later, err := s.Append(ctx, mine[1], eventstore.Exact(1), storetest.Event("A", 2))
	require.NoError(t, err)
	_, err = s.Append(ctx, other, eventstore.NoStream, storetest.Event("A", 3))
	require.NoError(t, err)
	require.True(t, inflight.Last().Less(later.Last()), "the in-flight event is first in read order")

	storetest.Settle(t, s, before.Last())
	got := storetest.ReadAll(t, s, eventstore.ReadOptions{Partition: p})
	require.Equal(t, []eventstore.Position{before.Last()}, positionsOf(got), "the later event waits behind the open transaction")
	head, err := s.HeadPartition(ctx, p)
	require.NoError(t, err)
	require.Equal(t, before.Last(), head)
	readTx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	inTx, err := s.ReadTx(ctx, readTx, before.Last(), eventstore.ReadOptions{Partition: p})
	require.NoError(t, err)
	require.Empty(t, inTx, "ReadTx waits too")
	require.NoError(t, readTx.Rollback(ctx))

	require.NoError(t, tx.Commit(ctx))
	storetest.Settle(t, s, later.Last())
	got = storetest.ReadAll(t, s, eventstore.ReadOptions{Partition: p, Limit: 1})
	require.Equal(t, []eventstore.Position{before.Last(), inflight.Last(), later.Last()}, positionsOf(got))
	head, err = s.HeadPartition(ctx, p)
	require.NoError(t, err)
	require.Equal(t, later.Last(), head)
}

func positionsOf(events []eventstore.Event) []eventstore.Position {
	out := make([]eventstore.Position, 0, len(events))
	for _, e := range events {
		out = append(out, e.Position)
	}
	return out
}

// partitionIndexes returns the partition indexes on the events table in schema, by name, with
// their validity.
func partitionIndexes(t *testing.T, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, schema string) map[string]bool {
	t.Helper()
	rows, err := q.Query(context.Background(), `SELECT c.relname, i.indisvalid AND i.indisready FROM pg_index i
		JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname LIKE 'nudge_events_partition_%' AND n.nspname = coalesce(nullif($1, ''), current_schema())`, schema)
	require.NoError(t, err)
	out := make(map[string]bool)
	for rows.Next() {
		var (
			name  string
			valid bool
		)
		require.NoError(t, rows.Scan(&name, &valid))
		out[name] = valid
	}
	require.NoError(t, rows.Err())
	return out
}

// TestEnsurePartitions: many callers at once, for two counts, all succeed and leave one valid
// index per count; a second call does nothing; counts 0 and 1 need no index; a bad count is
// refused; and an invalid index of the name (a failed build left it) is dropped and built again.
func TestEnsurePartitions(t *testing.T) {
	t.Parallel()
	for _, schema := range []string{"", "ops"} {
		t.Run("schema "+schema, func(t *testing.T) {
			t.Parallel()
			s, db := newStore(t, postgres.Config{Schema: schema})
			ctx := testwait.Context(t, 2*time.Minute)
			for i := range 300 {
				_, err := s.Append(ctx, fmt.Sprintf("s-%d", i%50), eventstore.Any, storetest.Event("A", i))
				require.NoError(t, err)
			}
			pool := db.NewPool(t, 12)
			store, err := postgres.New(pool, postgres.Config{Schema: schema})
			require.NoError(t, err)
			var wg sync.WaitGroup
			errs := make(chan error, 10)
			for i := range 10 {
				wg.Go(func() { errs <- store.EnsurePartitions(ctx, []int{16, 8}[i%2]) })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			want := map[string]bool{"nudge_events_partition_16_idx": true, "nudge_events_partition_8_idx": true}
			require.Equal(t, want, partitionIndexes(t, db.Pool, schema))
			require.NoError(t, s.EnsurePartitions(ctx, 16), "again")
			require.NoError(t, s.EnsurePartitions(ctx, 1))
			require.NoError(t, s.EnsurePartitions(ctx, 0))
			require.Equal(t, want, partitionIndexes(t, db.Pool, schema), "no index for 0 or 1")
			for _, bad := range []int{-1, eventstore.MaxPartitions + 1} {
				err := s.EnsurePartitions(ctx, bad)
				require.ErrorIs(t, err, eventstore.ErrInvalidInput)
			}

			// A concurrent unique build that fails on duplicates leaves an invalid index.
			events := "nudge_events"
			if schema != "" {
				events = schema + ".nudge_events"
			}
			_, err = db.Pool.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY nudge_events_partition_4_idx ON `+events+` (event_type)`)
			require.Error(t, err)
			require.Equal(t, false, partitionIndexes(t, db.Pool, schema)["nudge_events_partition_4_idx"], "the failed build left an invalid index")
			require.NoError(t, s.EnsurePartitions(ctx, 4))
			require.Equal(t, true, partitionIndexes(t, db.Pool, schema)["nudge_events_partition_4_idx"])
			var def string
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_get_indexdef(to_regclass($1))`,
				strings.TrimPrefix(schema+".nudge_events_partition_4_idx", ".")).Scan(&def))
			require.Contains(t, def, "% 4)")
			require.Contains(t, def, "transaction_id, global_position")
			require.NotContains(t, def, "UNIQUE")
		})
	}
}

// TestEnsurePartitionsRefusesOtherEncodings: in a LATIN1 database md5(stream_id) would hash
// other bytes than Go for ids outside ASCII, so EnsurePartitions refuses it.
func TestEnsurePartitionsRefusesOtherEncodings(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := testwait.Context(t, time.Minute)
	name := db.Name + "_latin1" // the test prefix, so a killed run's database is dropped later
	_, err := db.Pool.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()+` ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := db.Pool.Exec(context.Background(), `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`)
		require.NoError(t, err)
	})
	other := &pgtest.DB{Name: name, URL: strings.Replace(db.URL, "/"+db.Name, "/"+name, 1)}
	pool := other.NewPool(t, 2)
	s, err := postgres.New(pool, postgres.Config{})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	err = s.EnsurePartitions(ctx, 4)
	require.ErrorIs(t, err, postgres.ErrPartitionEncoding)
	require.ErrorContains(t, err, "LATIN1")
}
