package postgres_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/pgcluster"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
	pgdriver "github.com/nudgeworks/nudge/postgres"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/postgres"
)

// TestBatchCommitMode: a batch commits with synchronous_commit = off unless its projection
// appends events or sets SynchronousCommit, on a pool and on a single connection; the
// handler reads the setting inside the batch's transaction.
func TestBatchCommitMode(t *testing.T) {
	t.Parallel()
	ctx := testwait.Context(t, time.Minute)
	db := pgtest.New(t)
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
	for _, on := range []struct {
		name string
		db   pgdriver.DB
	}{{"pool", db.Pool}, {"connection", conn}} {
		store, err := espg.New(on.db, espg.Config{})
		require.NoError(t, err)
		require.NoError(t, store.Migrate(ctx))
		b, err := postgres.New(store)
		require.NoError(t, err)
		require.NoError(t, b.Migrate(ctx))
		seen := make(map[string]string)
		project := func(name string, cfg projection.Config) *projection.Projection {
			p, err := projection.New(name, cfg, projection.On("A", func(ctx context.Context, tx pgx.Tx, _ projection.Event[registered]) error {
				var mode string
				err := tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&mode)
				seen[name] = mode
				return err
			}))
			require.NoError(t, err)
			return p
		}
		r := runner(t, b,
			project("plain_"+on.name, projection.Config{}),
			project("sync_"+on.name, projection.Config{SynchronousCommit: true}),
			project("appends_"+on.name, projection.Config{AppendsEvents: true}))
		res, err := store.Append(ctx, "s-"+on.name, eventstore.Any, storetest.Event("A", 1))
		require.NoError(t, err)
		storetest.Settle(t, store, res.Events[0].Position)
		for _, name := range []string{"plain_", "sync_", "appends_"} {
			got, err := r.CatchUp(ctx, name+on.name)
			require.NoError(t, err)
			require.GreaterOrEqual(t, got.Events, 1, name+on.name)
		}
		require.Equal(t, map[string]string{"plain_" + on.name: "off", "sync_" + on.name: "on", "appends_" + on.name: "on"}, seen, on.name)
	}
}

// TestAsyncCommitLostInACrash: a server crash loses the batches committed asynchronously
// since the WAL writer's last flush — the read model's rows and the position together — and
// keeps those of a projection with SynchronousCommit. The next catch-up reads the lost events
// again and the read model holds each exactly once.
//
// The WAL writer is stopped (SIGSTOP) before the batches, so nothing flushes their commits;
// killing it (SIGKILL) then makes the postmaster treat it as a crash: every process ends, the
// shared memory and its unflushed WAL are gone, and the server recovers from the WAL on disk.
func TestAsyncCommitLostInACrash(t *testing.T) {
	t.Parallel()
	c := pgcluster.ForTestWith(t, pgcluster.Options{Durable: true})
	ctx := testwait.Context(t, 3*time.Minute)
	admin, err := pgx.Connect(ctx, c.URL("postgres", ""))
	require.NoError(t, err)
	// Nothing else may flush the WAL: no background writes of dirty pages (each flushes the
	// WAL up to the page first), no autovacuum.
	for _, set := range []string{`ALTER SYSTEM SET bgwriter_lru_maxpages = 0`, `ALTER SYSTEM SET autovacuum = off`, `SELECT pg_reload_conf()`} {
		_, err := admin.Exec(ctx, set)
		require.NoError(t, err)
	}
	var walWriter int
	require.NoError(t, admin.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'`).Scan(&walWriter))
	require.NoError(t, admin.Close(ctx))

	open := func() (*pgxpool.Pool, *espg.Store, *projection.Runner) {
		pool, err := pgxpool.New(ctx, c.URL("postgres", ""))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		store, err := espg.New(pool, espg.Config{})
		require.NoError(t, err)
		require.NoError(t, store.Migrate(ctx))
		b, err := postgres.New(store)
		require.NoError(t, err)
		require.NoError(t, b.Migrate(ctx))
		return pool, store, runner(t, b, countedProjection(t, "async", false), countedProjection(t, "durable", true))
	}
	pool, store, r := open()
	appendAndCatchUp := func(from, to int) {
		var last eventstore.Position
		for n := from; n <= to; n++ {
			res, err := store.Append(ctx, fmt.Sprintf("s-%d", n), eventstore.NoStream, storetest.Event("A", n))
			require.NoError(t, err)
			last = res.Events[0].Position
		}
		storetest.Settle(t, store, last)
		for _, name := range []string{"durable", "async"} { // the synchronous commit first: it would flush the other
			res, err := r.CatchUp(ctx, name)
			require.NoError(t, err)
			require.Equal(t, to-from+1, res.Events, name)
		}
	}
	appendAndCatchUp(1, 5)
	_, err = pool.Exec(ctx, `CHECKPOINT`)
	require.NoError(t, err)

	require.NoError(t, syscall.Kill(walWriter, syscall.SIGSTOP))
	appendAndCatchUp(6, 10) // the appends commit synchronously, the async projection's batch not
	require.Equal(t, 10, benchCount(t, pool, "async"), "an asynchronous commit is visible at once")
	require.Equal(t, 10, benchCount(t, pool, "durable"))
	require.NoError(t, syscall.Kill(walWriter, syscall.SIGKILL))
	pool.Close()

	require.Eventually(t, func() bool { // the postmaster restarts the server after its recovery
		conn, err := pgx.Connect(ctx, c.URL("postgres", ""))
		if err != nil {
			return false
		}
		defer func() { _ = conn.Close(ctx) }()
		var recovering bool
		return conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&recovering) == nil && !recovering
	}, testwait.For(2*time.Minute), 50*time.Millisecond, "the server recovers from the crash")

	pool, _, r = open()
	require.Equal(t, 10, benchCount(t, pool, "durable"), "a synchronous commit survives the crash")
	require.Equal(t, 5, benchCount(t, pool, "async"), "the crash lost the asynchronous batch: its rows")
	st, err := r.Status(ctx, "async")
	require.NoError(t, err)
	require.EqualValues(t, 5, st.EventsProcessed, "the crash lost the asynchronous batch: its position")

	res, err := r.CatchUp(ctx, "async")
	require.NoError(t, err)
	require.Equal(t, 5, res.Events, "the lost batch's events are read again")
	require.Equal(t, 10, benchCount(t, pool, "async"))
	var twice int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM async WHERE times <> 1`).Scan(&twice))
	require.Zero(t, twice, "every event once in the read model")
}

// countedProjection is a projection named name whose read model counts how often it handled
// each event of type A.
func countedProjection(t *testing.T, name string, synchronous bool) *projection.Projection {
	t.Helper()
	p, err := projection.New(name, projection.Config{
		SynchronousCommit: synchronous,
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+name+` (n int PRIMARY KEY, times int NOT NULL)`)
			return err
		},
	}, projection.OnQueued("A", func(_ context.Context, q *projection.Queue, e projection.Event[registered]) error {
		q.Queue(`INSERT INTO `+name+` (n, times) VALUES ($1, 1) ON CONFLICT (n) DO UPDATE SET times = `+name+`.times + 1`, e.Data.N)
		return nil
	}))
	require.NoError(t, err)
	return p
}
