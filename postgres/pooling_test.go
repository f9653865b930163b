package postgres_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/pgbouncertest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/postgres"
)

// TestListenThroughTransactionPoolingIsNotYours shows why a listener needs a direct connection
// (SessionConnect, ListenConnect) behind PgBouncer in transaction mode: LISTEN runs on the server connection
// PgBouncer lends for that one statement, then the server connection goes to the next client,
// which finds itself listening, while the listener's client connection listens to nothing.
func TestListenThroughTransactionPoolingIsNotYours(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	b := pgbouncertest.Start(t, db.URL, pgbouncertest.Options{PoolSize: 1})
	ctx := testwait.Context(t, time.Minute)
	listener, err := pgx.Connect(ctx, b.URL)
	require.NoError(t, err)
	defer func() { _ = listener.Close(ctx) }()
	_, err = listener.Exec(ctx, "LISTEN "+postgres.NotifyEvents)
	require.NoError(t, err)

	other, err := pgx.Connect(ctx, b.URL)
	require.NoError(t, err)
	defer func() { _ = other.Close(ctx) }()
	var channels []string
	require.NoError(t, other.QueryRow(ctx, "SELECT array_agg(c) FROM pg_listening_channels() c").Scan(&channels))
	require.Equal(t, []string{postgres.NotifyEvents}, channels, "another client of %s got the listening session", b.Version)
}

// TestCheckTransactionPooling: a pool that prepares statements by name per connection (pgx's
// default) is refused; the describe-only and exec modes pass.
func TestCheckTransactionPooling(t *testing.T) {
	t.Parallel()
	for mode, refused := range map[pgx.QueryExecMode]bool{
		pgx.QueryExecModeCacheStatement: true,
		pgx.QueryExecModeCacheDescribe:  false,
		pgx.QueryExecModeExec:           false,
		pgx.QueryExecModeSimpleProtocol: false,
	} {
		cfg, err := pgxpool.ParseConfig(pgtest.URL())
		require.NoError(t, err)
		cfg.ConnConfig.DefaultQueryExecMode = mode
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg) // connects lazily
		require.NoError(t, err)
		err = postgres.CheckTransactionPooling(pool)
		pool.Close()
		if refused {
			require.ErrorIs(t, err, postgres.ErrSessionNeeded, mode)
		} else {
			require.NoError(t, err, mode)
		}
	}
}
