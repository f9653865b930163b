package pgbouncertest_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/pgbouncertest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// TestPreparedStatementsThroughTransactionPooling shows what PgBouncer's transaction pooling
// does to pgx's default of preparing each statement once per connection: two client
// connections share one server connection, and the second's statements clash with the first's.
// The describe-only and exec modes prepare nothing by name and work.
func TestPreparedStatementsThroughTransactionPooling(t *testing.T) {
	db := pgtest.New(t)
	b := pgbouncertest.Start(t, db.URL, pgbouncertest.Options{PoolSize: 1})
	t.Log(b.Version)
	ctx := testwait.Context(t, time.Minute)
	run := func(mode pgx.QueryExecMode) error {
		cfg, err := pgxpool.ParseConfig(b.URL)
		require.NoError(t, err)
		cfg.ConnConfig.DefaultQueryExecMode = mode
		cfg.MinConns, cfg.MaxConns = 2, 2
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		defer pool.Close()
		a, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer a.Release()
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer c.Release()
		for range 3 {
			for _, conn := range []*pgxpool.Conn{a, c} {
				var n int
				if err := conn.QueryRow(ctx, "SELECT $1::int + 1", 1).Scan(&n); err != nil {
					return err
				}
			}
		}
		return nil
	}
	require.Error(t, run(pgx.QueryExecModeCacheStatement), "named prepared statements clash behind %s", b.Version)
	require.NoError(t, run(pgx.QueryExecModeCacheDescribe))
	require.NoError(t, run(pgx.QueryExecModeExec))
}
