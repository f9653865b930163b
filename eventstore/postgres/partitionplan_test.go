package postgres

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/eventload"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// TestPartitionReadPlan: with the index of EnsurePartitions, every partitioned statement (the
// read with and without types, with and without payloads, and the partition's head) reads the
// partition index alone, bounded by the position and the horizon in the index condition, and
// visits no event of another partition; while many events are left, it walks the index in read
// order and stops at the page's end. Both as planned for the values (custom plan) and for any
// values (the generic plan a cached prepared statement may switch to). Read and ReadTx send
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
	// ordered: the page is a small part of what is left, so the plan must walk the index in
	// read order and stop at the page's end (no sort).
	cases := map[string]struct {
		sql     string
		types   string
		args    string
		ordered bool
	}{
		"read":              {st.read[0], "xid8, bigint, int, int", "'0', 0, 100, 5", true},
		"read bare":         {st.read[1], "xid8, bigint, int, int", "'0', 0, 100, 5", true},
		"read types":        {st.readTypes[0], "xid8, bigint, int, int, text[]", "'0', 0, 100, 5, '{TicketWasRegistered}'", true},
		"read types bare":   {st.readTypes[1], "xid8, bigint, int, int, text[]", "'0', 0, 100, 5, '{TicketWasRegistered}'", true},
		"head of partition": {st.head, "int", "5", true},
		// Fewer events are left in the partition than the page holds: the planner may fetch
		// them all through the partition index and sort them, which reads nothing more.
		"the end of the partition, a page of 1000": {st.read[0], "xid8, bigint, int, int", mid + ", 1000, 5", false},
	}
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
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
			// The events' scan and what follows it, without the horizon's subplans before it.
			at := strings.Index(plan, " on nudge_events ")
			require.GreaterOrEqual(t, at, 0, "%s, %s: no scan of the events", name, mode)
			assert.NotContains(t, plan[at:], "Rows Removed by", "%s, %s: no event is read and dropped", name, mode)
			for _, other := range []string{"Seq Scan on nudge_events", "nudge_events_read_order_idx", "nudge_events_type_order_idx"} {
				assert.NotContains(t, plan, other, "%s, %s: no other partition's events are visited", name, mode)
			}
			if c.ordered {
				assert.Regexp(t, `Index Scan (Backward )?using nudge_events_partition_16_idx on nudge_events`, plan, "%s, %s", name, mode)
				assert.NotContains(t, plan, "Sort Key: (", "%s, %s", name, mode)
				assert.NotContains(t, plan, "Bitmap", "%s, %s", name, mode)
			}
			assert.Regexp(t, `Index Cond: \(\(\(\(\(\(\('x'::text \|\| substr\(md5\(stream_id\), 1, 8\)\)\)::bit\(32\)\)::integer & 2147483647\) % 16\) = ANY .*transaction_id < \$\d+\)\)`, plan, "%s, %s", name, mode)
		}
	}
}
