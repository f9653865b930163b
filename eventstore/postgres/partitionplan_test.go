package postgres

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/eventload"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// TestPartitionReadPlan: with the index of EnsurePartitions, every partitioned statement (the
// read with and without types, with and without payloads, and the partition's head) reads the
// partition index alone in read order, bounded by the position and the horizon in the index
// condition, stops at the page's end and visits no event of another partition: at the start of
// a partition and near the end of the log (where the planner expects nothing left), as planned
// for the values (custom plan) and for any values (the generic plan a cached prepared statement
// may switch to), with sorting off as the store runs these statements. Read and ReadTx send
// the same statements.
func TestPartitionReadPlan(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := testwait.Context(t, 2*time.Minute)
	s, err := New(db.Pool, Config{})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	eventload.Load(t, db.Pool, 40_000, 2_000, "TicketWasRegistered", func(string, int) string { return `{}` })
	require.NoError(t, s.EnsurePartitions(ctx, 16))
	_, err = db.Pool.Exec(ctx, `ANALYZE nudge_events`)
	require.NoError(t, err)

	st := s.partitions.forCount(16)
	var mid string // the position of the 30,000th event, as arguments
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT format('%L, %s', transaction_id, global_position) FROM nudge_events
		ORDER BY transaction_id, global_position OFFSET 29999 LIMIT 1`).Scan(&mid))
	cases := map[string]struct {
		sql   string
		types string
		args  string
	}{
		"read":              {st.read[0], "xid8, bigint, int, int, xid8", "'0', 0, 100, 5, '1'"},
		"read bare":         {st.read[1], "xid8, bigint, int, int, xid8", "'0', 0, 100, 5, '1'"},
		"read types":        {st.readTypes[0], "xid8, bigint, int, int, text[], xid8", "'0', 0, 100, 5, '{TicketWasRegistered}', '1'"},
		"read types bare":   {st.readTypes[1], "xid8, bigint, int, int, text[], xid8", "'0', 0, 100, 5, '{TicketWasRegistered}', '1'"},
		"head of partition": {st.head, "int, xid8", "5, '1'"},
		// Near the end of the log the planner expects almost nothing left: left to its
		// estimates it would fetch all of it and sort, or walk the read-order index.
		"near the end, a page of 1000": {st.read[0], "xid8, bigint, int, int, xid8", mid + ", 1000, 5, '1'"},
		"the start, a page of 1000":    {st.read[0], "xid8, bigint, int, int, xid8", "'0', 0, 1000, 5, '1'"},
	}
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	// The store sets it for each partitioned statement alone (sortOff); TestPartitionReadWork
	// checks the store's reads themselves.
	_, err = conn.Exec(ctx, `SET enable_sort = off`)
	require.NoError(t, err)
	for name, c := range cases {
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			_, err := conn.Exec(ctx, `SET plan_cache_mode = `+mode)
			require.NoError(t, err)
			_, err = conn.Exec(ctx, `PREPARE p(`+c.types+`) AS `+c.sql)
			require.NoError(t, err)
			var lines []string
			rows, err := conn.Query(ctx, `EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) EXECUTE p(`+c.args+`)`)
			require.NoError(t, err)
			for rows.Next() {
				var line string
				require.NoError(t, rows.Scan(&line))
				lines = append(lines, line)
			}
			require.NoError(t, rows.Err())
			_, err = conn.Exec(ctx, `DEALLOCATE p`)
			require.NoError(t, err)
			plan := strings.Join(lines, "\n")
			t.Logf("%s, %s:\n%s", name, mode, plan)
			assert.Contains(t, plan, "nudge_events_partition_16_idx", "%s, %s", name, mode)
			// The horizon's probe (see horizon): the newest transaction id, one entry from the
			// end of the read-order index.
			probe := horizonProbe.FindAllStringIndex(plan, -1)
			require.Len(t, probe, 1, "%s, %s: the horizon's probe:\n%s", name, mode, plan)
			plan = plan[:probe[0][0]] + plan[probe[0][1]:]
			// The events' scan and what follows it, without the horizon's subplans before it.
			at := strings.Index(plan, " on nudge_events ")
			require.GreaterOrEqual(t, at, 0, "%s, %s: no scan of the events", name, mode)
			assert.NotContains(t, plan[at:], "Rows Removed by", "%s, %s: no event is read and dropped", name, mode)
			for _, other := range []string{"Seq Scan on nudge_events", "nudge_events_read_order_idx", "nudge_events_type_order_idx"} {
				assert.NotContains(t, plan, other, "%s, %s: no other partition's events are visited", name, mode)
			}
			assert.Regexp(t, `Index Scan (Backward )?using nudge_events_partition_16_idx on nudge_events`, plan, "%s, %s", name, mode)
			assert.NotContains(t, plan, "Sort Key: (", "%s, %s", name, mode)
			assert.NotContains(t, plan, "Bitmap", "%s, %s", name, mode)
			assert.Regexp(t, `Index Cond: \(\(\(\(\(\(\('x'::text \|\| substr\(md5\(stream_id\), 1, 8\)\)\)::bit\(32\)\)::integer & 2147483647\) % 16\) = ANY .*transaction_id < GREATEST\(CASE WHEN COALESCE\(\(\$\d+ >= pg_snapshot_xmin\(pg_current_snapshot\(\)\)\), false\) THEN \$\d+ ELSE pg_snapshot_xmin\(pg_current_snapshot\(\)\) END, .*\)\)\)`, plan, "%s, %s", name, mode)
		}
	}
}

// horizonProbe matches the horizon's probe in a plan (see horizon).
var horizonProbe = regexp.MustCompile(`Index Only Scan Backward using nudge_events_read_order_idx on nudge_events \w+\s+\(.*\n\s+Index Cond: \(transaction_id IS NOT NULL\)`)

// TestPartitionReadWork: reading every partition to its end through Read, ReadTx and
// HeadPartition fetches each event once and never walks the read-order index (the horizon's
// probe reads at most one entry of it per statement): the server's own counters (pg_stat_user_tables, pg_stat_user_indexes) of the reading connection say so.
func TestPartitionReadWork(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := testwait.Context(t, 2*time.Minute)
	s, err := New(db.Pool, Config{})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	const events, count, page = 20_000, 16, 500
	last := eventload.Load(t, db.Pool, events, 5_000, "TicketWasRegistered", func(string, int) string { return `{"a": 1}` })
	require.NoError(t, s.EnsurePartitions(ctx, count))
	_, err = db.Pool.Exec(ctx, `VACUUM ANALYZE nudge_events`)
	require.NoError(t, err)

	pool := db.NewPool(t, 1) // one backend, whose counters are read
	reader, err := New(pool, Config{})
	require.NoError(t, err)
	storetest.Settle(t, reader, last) // other tests' transactions may hold the horizon a while
	counters := func() (fetched, readOrder, partition int64) {
		fetched, read := eventsCounters(ctx, t, pool)
		return fetched, read["nudge_events_read_order_idx"], read["nudge_events_partition_16_idx"]
	}
	fetched0, readOrder0, partition0 := counters()
	total, statements := 0, 0
	for i := range count {
		p := eventstore.Partition{Index: i, Count: count}
		var after eventstore.Position
		for n := 0; ; n++ {
			read := func() ([]eventstore.Event, error) {
				return reader.Read(ctx, after, eventstore.ReadOptions{Limit: page, Partition: p})
			}
			if n%2 == 1 { // every other page in a transaction of the caller's
				read = func() (events []eventstore.Event, err error) {
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						events, err = reader.ReadTx(ctx, tx, after, eventstore.ReadOptions{Limit: page, Partition: p})
						return err
					})
					return events, err
				}
			}
			got, err := read()
			require.NoError(t, err)
			statements++
			if len(got) == 0 {
				break
			}
			total += len(got)
			after = got[len(got)-1].Position
		}
		head, err := reader.HeadPartition(ctx, p)
		require.NoError(t, err)
		statements++
		require.Equal(t, after, head)
	}
	require.Equal(t, events, total)
	fetched, readOrder, partition := counters()
	require.LessOrEqual(t, readOrder-readOrder0, int64(statements), "the read-order index was walked beyond the horizon's probes")
	require.LessOrEqual(t, fetched-fetched0, int64(events+count), "heap tuples fetched: each event once, and each partition's head")
	require.LessOrEqual(t, partition-partition0, int64(events+2*count), "partition index entries read")
}
