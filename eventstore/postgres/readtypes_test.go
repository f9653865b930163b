package postgres

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/eventload"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// TestTypedReadWork: reading some event types to the end of the log, page by page, reads
// index entries and heap tuples in proportion to what it returns (one type: each event once,
// and one more entry per read) or to the log (several types: the log once), never the rest of
// the backlog for each page, whatever the types' share of the log and the table's statistics:
// here one type is rare, and the statistics have not seen the last half of the log, all of a
// new type (the log grew after its last ANALYZE, as a busy store's does between autovacuum's).
// The server's own counters of the reading connection say so. With one condition
// event_type = ANY(types), left to its estimates, the planner fetched and sorted every event of
// the types after the position for each page: tens of times the events returned here.
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
	eventload.LoadTyped(t, db.Pool, events, 300, kinds, func(string, int) string { return `{}` })
	want := map[string]int{}
	for i := range events {
		want[kinds(i)]++
	}
	// Statistics of these events; then as many of a type they have not seen, as a type a new
	// release starts appending has.
	_, err = db.Pool.Exec(ctx, `ANALYZE nudge_events`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO nudge_events (event_id, stream_id, stream_version, event_type, payload)
		SELECT gen_random_uuid(), 'late-' || g, 1, 'Late', '{}' FROM generate_series(1, $1::int) g`, events)
	require.NoError(t, err)
	want["Late"] = events
	var last eventstore.Position
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT transaction_id, global_position FROM nudge_events
		ORDER BY transaction_id DESC, global_position DESC LIMIT 1`).Scan(&last.TransactionID, &last.GlobalPosition))

	pool := db.NewPool(t, 1) // one backend, whose counters are read
	reader, err := New(pool, Config{})
	require.NoError(t, err)
	storetest.Settle(t, reader, last) // other tests' transactions may hold the horizon a while
	counters := func() (read, fetched int64) {
		fetched, byIndex := eventsCounters(ctx, t, pool)
		for _, n := range byIndex {
			read += n
		}
		return read, fetched
	}
	for _, c := range []struct {
		types []string
		page  int
	}{
		{[]string{"Rare"}, 5},
		{[]string{"Even"}, 100},
		{[]string{"Odd", "Rare", "Even", "Odd"}, 100}, // a type named twice is read once
		{[]string{"Rare", "Unknown"}, 5},
		{[]string{"Late"}, 100},
		{[]string{"Late", "Rare"}, 100},
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
		// One type: its events, and per read the horizon's probe and one entry past the page.
		// Several: the log once, and per read the probe and the page's last event again.
		bound := int64(total + 2*reads)
		if len(distinct) > 1 {
			bound = int64(2*events + 2*reads) // the log: the typed events and the Late ones
		}
		require.LessOrEqual(t, read-read0, bound, "%v: index entries read for %d events in %d reads", c.types, total, reads)
		require.LessOrEqual(t, fetched-fetched0, bound, "%v: heap tuples fetched for %d events in %d reads", c.types, total, reads)
		t.Logf("%v: %d events in %d reads: %d index entries read, %d tuples fetched", c.types, total, reads, read-read0, fetched-fetched0)
	}
}

// eventsCounters returns the events table's counters as pool's one backend reported them: the
// heap tuples its index scans fetched, and the entries read from each of its indexes, by name.
func eventsCounters(ctx context.Context, t *testing.T, pool *pgxpool.Pool) (fetched int64, read map[string]int64) {
	t.Helper()
	_, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`) // reported when the backend goes idle
	require.NoError(t, err)
	require.NoError(t, pool.QueryRow(ctx, `SELECT idx_tup_fetch FROM pg_stat_user_tables WHERE relname = 'nudge_events'`).Scan(&fetched))
	rows, err := pool.Query(ctx, `SELECT indexrelname, idx_tup_read FROM pg_stat_user_indexes WHERE relname = 'nudge_events'`)
	require.NoError(t, err)
	read = make(map[string]int64)
	var (
		name string
		n    int64
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &n}, func() error { read[name] = n; return nil })
	require.NoError(t, err)
	return fetched, read
}
