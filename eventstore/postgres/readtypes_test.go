package postgres

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/eventload"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// TestTypedReadWork: reading some event types to the end of the log, page by page, reads
// about as many index entries and heap tuples as it returns (and at most a page more of each
// other type per read), whatever the types' share of the log and the table's statistics: here the statistics are those of the empty table (the log
// grew after its last ANALYZE, as a busy store's does between autovacuum's), and one type is
// rare. The server's own counters of the reading connection say so. With one condition
// event_type = ANY(types), the planner fetched and sorted every event of the types after the
// position for each page: tens of times the events returned here.
func TestTypedReadWork(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := testwait.Context(t, 2*time.Minute)
	s, err := New(db.Pool, Config{})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	_, err = db.Pool.Exec(ctx, `ALTER TABLE nudge_events SET (autovacuum_enabled = false); ANALYZE nudge_events`)
	require.NoError(t, err)
	const events = 12_000
	kinds := func(i int) string { // 1 % Rare, the rest Even and Odd in turn
		switch {
		case i%100 == 0:
			return "Rare"
		case i%2 == 0:
			return "Even"
		}
		return "Odd"
	}
	last := eventload.LoadTyped(t, db.Pool, events, 300, kinds, func(string, int) string { return `{}` })
	want := map[string]int{}
	for i := range events {
		want[kinds(i)]++
	}

	pool := db.NewPool(t, 1) // one backend, whose counters are read
	reader, err := New(pool, Config{})
	require.NoError(t, err)
	storetest.Settle(t, reader, last) // other tests' transactions may hold the horizon a while
	counters := func() (read, fetched int64) {
		_, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`) // reported when the backend goes idle
		require.NoError(t, err)
		require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT sum(idx_tup_read) FROM pg_stat_user_indexes WHERE relname = 'nudge_events'),
			(SELECT idx_tup_fetch FROM pg_stat_user_tables WHERE relname = 'nudge_events')`).Scan(&read, &fetched))
		return read, fetched
	}
	for _, c := range []struct {
		types []string
		page  int
	}{
		{[]string{"Rare"}, 5},
		{[]string{"Even"}, 100},
		{[]string{"Odd", "Rare", "Even", "Odd"}, 100}, // a type named twice is read once
	} {
		read0, fetched0 := counters()
		total, reads := 0, 0
		var after eventstore.Position
		for {
			got, err := reader.Read(ctx, after, eventstore.ReadOptions{Limit: c.page, Types: c.types})
			require.NoError(t, err)
			reads++
			if len(got) == 0 {
				break
			}
			for i, e := range got {
				require.Contains(t, c.types, e.Type)
				if i > 0 {
					require.True(t, got[i-1].Position.Less(e.Position), "read order")
				}
			}
			total += len(got)
			after = got[len(got)-1].Position
		}
		expected := 0
		distinct := slices.Compact(slices.Sorted(slices.Values(c.types)))
		for _, typ := range distinct {
			expected += want[typ]
		}
		require.Equal(t, expected, total, "%v", c.types)
		read, fetched := counters()
		// Per read: the horizon's probe, one entry past each type's events, and up to a page of
		// each other type (its events after the page's last come again in the next page).
		types := len(distinct)
		slack := int64(reads * (1 + types + (types-1)*c.page))
		require.LessOrEqual(t, read-read0, int64(total)+slack, "%v: index entries read for %d events in %d reads", c.types, total, reads)
		require.LessOrEqual(t, fetched-fetched0, int64(total)+slack, "%v: heap tuples fetched for %d events in %d reads", c.types, total, reads)
		t.Logf("%v: %d events in %d reads: %d index entries read, %d tuples fetched", c.types, total, reads, read-read0, fetched-fetched0)
	}
}
