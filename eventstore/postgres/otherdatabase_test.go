package postgres

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/pgcluster"
)

// clusterWithOtherDatabase starts a private cluster (opts) with a second database, other, that
// holds a table report for the transactions of another database the horizon tests run. It
// returns the cluster and a connect that opens a connection to a database of it, closed when
// the test ends.
func clusterWithOtherDatabase(ctx context.Context, t *testing.T, opts pgcluster.Options) (*pgcluster.Cluster, func(db string) *pgx.Conn) {
	t.Helper()
	c := pgcluster.ForTestWith(t, opts)
	connect := func(db string) *pgx.Conn {
		conn, err := pgx.Connect(ctx, c.URL(db, ""))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		return conn
	}
	_, err := connect("postgres").Exec(ctx, `CREATE DATABASE other`)
	require.NoError(t, err)
	_, err = connect("other").Exec(ctx, `CREATE TABLE report (n int)`)
	require.NoError(t, err)
	return c, connect
}
