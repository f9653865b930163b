package postgres_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/pgbouncertest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// TestEnsurePartitionsOnSessionConnect: on a pool through PgBouncer in transaction mode, the
// partition index is built on the direct connection Config.SessionConnect opens, which holds
// the build's session advisory lock from lock to unlock and is closed after: no lock is left
// on a server connection PgBouncer lends to others.
func TestEnsurePartitionsOnSessionConnect(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	b := pgbouncertest.Start(t, db.URL, pgbouncertest.Options{PoolSize: 2})
	ctx := testwait.Context(t, time.Minute)
	cfg, err := pgxpool.ParseConfig(b.URL)
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	bounced, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(bounced.Close)
	var opened atomic.Int32
	s, err := postgres.New(bounced, postgres.Config{SessionConnect: func(ctx context.Context) (*pgx.Conn, error) {
		opened.Add(1)
		return pgx.Connect(ctx, db.URL)
	}})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	require.NoError(t, s.EnsurePartitions(ctx, 4))
	require.EqualValues(t, 1, opened.Load(), "one direct connection, for the build")
	var valid bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('nudge_events_partition_4_idx')`).Scan(&valid))
	require.True(t, valid)
	var locks int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&locks))
	require.Zero(t, locks)
}
