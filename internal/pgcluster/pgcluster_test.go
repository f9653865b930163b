package pgcluster

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// TestDurableClusterWithPasswordChecksItAndRecoversFromACrash: Options.Password makes TCP
// connections authenticate with scram-sha-256 (a wrong password fails with SQLSTATE 28P01, the
// right one connects), Options.Durable turns fsync and full_page_writes on, and a committed
// row survives an immediate stop.
func TestDurableClusterWithPasswordChecksItAndRecoversFromACrash(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(5*time.Minute))
	defer cancel()
	log := slog.New(slog.NewTextHandler(testlog.NewWriter(t), &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := NewWith(ctx, log, Options{Durable: true, Password: "right-secret"})
	if err != nil {
		msg := "pgcluster: cannot start a private PostgreSQL cluster: " + err.Error()
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(func() { c.Remove(context.Background()) })

	_, err = pgx.Connect(ctx, c.URL("postgres", "wrong-secret"))
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "a wrong password must fail authentication: %v", err)
	require.Equal(t, "28P01", pgErr.Code)
	require.NotContains(t, err.Error(), "wrong-secret")

	conn, err := pgx.Connect(ctx, c.URL("postgres", "right-secret"))
	require.NoError(t, err)
	for setting, want := range map[string]string{"fsync": "on", "full_page_writes": "on", "password_encryption": "scram-sha-256"} {
		var got string
		require.NoError(t, conn.QueryRow(ctx, "SHOW "+setting).Scan(&got))
		require.Equal(t, want, got, setting)
	}
	var method string
	require.NoError(t, conn.QueryRow(ctx, `SELECT auth_method FROM pg_hba_file_rules WHERE type = 'host' LIMIT 1`).Scan(&method))
	require.Equal(t, "scram-sha-256", method)
	_, err = conn.Exec(ctx, `CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)`)
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))

	require.NoError(t, c.Stop(ctx, "immediate"))
	require.NoError(t, c.Start(ctx))
	conn, err = pgx.Connect(ctx, c.URL("postgres", "right-secret"))
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	var v int
	require.NoError(t, conn.QueryRow(ctx, `SELECT v FROM kept`).Scan(&v))
	require.Equal(t, 42, v)
}
