package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// TestHorizonProbe: a read whose events all lie below every running transaction leaves the
// lock table alone, and reads exactly what the full horizon reads; once an event lies at or
// above a running transaction that may append, the read scans the lock table and stops below
// that transaction.
//
// A transaction T is running, with an id taken after the store's events, and a later one has
// committed: the snapshot's xmin is T's id, above every event, and the read plan's scan of
// pg_locks is never executed (before the probe, the read scanned it whenever the snapshot
// listed a running transaction). Then an event commits above
// T: the read scans the lock table, finds T (not exempt) and returns the events below it only,
// until T ends.
func TestHorizonProbe(t *testing.T) {
	t.Parallel()
	// T below holds the cluster's horizon while it runs; the scan's absence needs no older
	// transaction running anywhere in the cluster.
	pgtest.HoldHorizonTurn(t)
	db := pgtest.New(t)
	ctx := testwait.Context(t, time.Minute)
	s, err := New(db.Pool, Config{})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	var last eventstore.Position
	for range 3 {
		res, err := s.Append(ctx, "probe-1", eventstore.Any, eventstore.EventData{Type: "Probed", Payload: []byte(`{}`)})
		require.NoError(t, err)
		last = res.Events[0].Position
	}
	storetest.Settle(t, s, last) // other tests' transactions may hold the horizon a moment

	// T: a transaction that may append, with an id above every event.
	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(context.WithoutCancel(ctx)) }()
	_, err = holder.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)
	// A later transaction that appends nothing commits: T is below the snapshots' xmax now, in
	// their list of running transactions, which the full horizon looks through.
	later, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = later.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)
	require.NoError(t, later.Commit(ctx))

	// Another test's short transaction, older than these events, may still be running a
	// moment: it holds the snapshot's xmin below them, and the read needs the scan meanwhile.
	reader := db.NewPool(t, 1)
	require.Eventually(t, func() bool { return !lockScanRan(t, ctx, reader, s) }, testwait.For(20*time.Second), 10*time.Millisecond,
		"every event below the running transaction: the lock table is not scanned")
	got, err := s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{Limit: 100})
	require.NoError(t, err)
	require.Len(t, got, 3)

	// An event above T commits: T may still append below it.
	_, err = s.Append(ctx, "probe-2", eventstore.Any, eventstore.EventData{Type: "Probed", Payload: []byte(`{}`)})
	require.NoError(t, err)
	require.True(t, lockScanRan(t, ctx, reader, s), "an event above a running transaction: the horizon scans the lock table")
	got, err = s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{Limit: 100})
	require.NoError(t, err)
	require.Len(t, got, 3, "the event above the running transaction waits for it")

	require.NoError(t, holder.Rollback(ctx))
	// Another database's transaction in its commit window may hold the horizon a moment longer.
	require.Eventually(t, func() bool {
		got, err = s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{Limit: 100})
		require.NoError(t, err)
		return len(got) == 4
	}, testwait.For(20*time.Second), 10*time.Millisecond, "the event above the transaction is read once it ends")
}

// lockScanRan reports whether the store's read from the start ran its scan of the lock table,
// by the plan's own account (EXPLAIN ANALYZE of the prepared read).
func lockScanRan(t *testing.T, ctx context.Context, pool *pgxpool.Pool, s *Store) bool {
	t.Helper()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `PREPARE probe_read(xid8, bigint, int, xid8) AS `+s.sql.read[0])
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), `DEALLOCATE probe_read`) }()
	rows, err := conn.Query(ctx, `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) EXECUTE probe_read('0', 0, 100, '1')`)
	require.NoError(t, err)
	var plan []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan = append(plan, line)
	}
	require.NoError(t, rows.Err())
	for _, line := range plan {
		if strings.Contains(line, "Function Scan on pg_lock_status") {
			return !strings.Contains(line, "never executed")
		}
	}
	t.Fatalf("no scan of pg_locks in the read's plan:\n%s", strings.Join(plan, "\n"))
	return false
}
