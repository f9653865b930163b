package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/pgcluster"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// TestHorizonHolderNamesTheSession: on a private cluster (no other transaction runs there),
// the transaction holding the horizon is named — in another database, in the store's own
// database after it appended, and without the privilege to see other users' sessions — and
// the report clears as soon as it ends, with nothing skipped.
func TestHorizonHolderNamesTheSession(t *testing.T) {
	c := pgcluster.ForTest(t)
	ctx := testwait.Context(t, 2*time.Minute)
	connect := func(db, user, app string) *pgx.Conn {
		cfg, err := pgx.ParseConfig(c.URL(db, ""))
		require.NoError(t, err)
		cfg.User = user
		cfg.RuntimeParams["application_name"] = app
		conn, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		return conn
	}
	admin := connect("postgres", "postgres", "admin")
	_, err := admin.Exec(ctx, `CREATE DATABASE other`)
	require.NoError(t, err)
	s, err := postgres.New(admin, postgres.Config{})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))

	h, err := s.HorizonHolder(ctx)
	require.NoError(t, err)
	require.Nil(t, h, "nothing is open")

	t.Run("a transaction in another database", func(t *testing.T) {
		report := connect("other", "postgres", "nightly-report")
		tx, err := report.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		var xid uint64
		require.NoError(t, tx.QueryRow(ctx, `SELECT pg_current_xact_id()`).Scan(&xid))
		h, err := s.HorizonHolder(ctx)
		require.NoError(t, err)
		require.Nil(t, h, "it holds no committed event back yet")

		res, err := s.Append(ctx, "held", eventstore.Any, storetest.Event("A", 1))
		require.NoError(t, err)
		// The session reports itself idle a moment after its client has the reply.
		require.Eventually(t, func() bool {
			h, err = s.HorizonHolder(ctx)
			return err == nil && h != nil && h.WaitEvent != ""
		}, testwait.For(time.Minute), time.Millisecond)
		require.Equal(t, xid, h.TransactionID)
		require.Empty(t, h.Hidden)
		require.Equal(t, int(report.PgConn().PID()), h.PID)
		require.Equal(t, "other", h.Database)
		require.Equal(t, "postgres", h.User)
		require.Equal(t, "nightly-report", h.ApplicationName)
		require.Equal(t, "127.0.0.1", h.ClientAddr)
		require.Equal(t, "idle in transaction", h.State)
		require.Equal(t, "Client:ClientRead", h.WaitEvent)
		require.Positive(t, h.Age)
		require.False(t, h.WritesEventsKnown, "another database's locks say nothing of this table")
		require.Equal(t, int64(1), h.HeldEvents)
		require.Contains(t, h.String(), "nightly-report")

		require.NoError(t, tx.Rollback(ctx))
		h, err = s.HorizonHolder(ctx)
		require.NoError(t, err)
		require.Nil(t, h, "the report clears when the holder ends")
		require.Equal(t, []string{res.Events[0].ID.String()}, ids(storetest.ReadAll(t, s, eventstore.ReadOptions{})))
	})

	t.Run("an appender in the store's database", func(t *testing.T) {
		app := connect("postgres", "postgres", "importer")
		tx, err := app.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = s.AppendTx(ctx, tx, "importing", eventstore.Any, storetest.Event("A", 2))
		require.NoError(t, err)
		_, err = s.Append(ctx, "after", eventstore.Any, storetest.Event("A", 3))
		require.NoError(t, err)
		h, err := s.HorizonHolder(ctx)
		require.NoError(t, err)
		require.NotNil(t, h)
		require.Equal(t, int(app.PgConn().PID()), h.PID)
		require.True(t, h.WritesEventsKnown)
		require.True(t, h.WritesEvents, "it has appended")
	})

	t.Run("without pg_read_all_stats", func(t *testing.T) {
		_, err := admin.Exec(ctx, `CREATE ROLE limited LOGIN; GRANT SELECT ON nudge_events TO limited`)
		require.NoError(t, err)
		limited, err := postgres.New(connect("postgres", "limited", "status"), postgres.Config{})
		require.NoError(t, err)

		tx, err := connect("other", "postgres", "nightly-report").Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		var xid uint64
		require.NoError(t, tx.QueryRow(ctx, `SELECT pg_current_xact_id()`).Scan(&xid))
		_, err = s.Append(ctx, "held", eventstore.Any, storetest.Event("A", 4))
		require.NoError(t, err)

		h, err := limited.HorizonHolder(ctx)
		require.NoError(t, err)
		require.NotNil(t, h)
		require.Equal(t, xid, h.TransactionID, "the id is known without the privilege")
		require.Contains(t, h.Hidden, "GRANT pg_read_all_stats TO limited")
		require.Equal(t, "nightly-report", h.ApplicationName, "PostgreSQL shows the session itself")
		require.Positive(t, h.PID)
		require.Zero(t, h.Age, "but not when its transaction began")
		require.Empty(t, h.State)
		require.Positive(t, h.HeldEvents)

		_, err = admin.Exec(ctx, `GRANT pg_read_all_stats TO limited`)
		require.NoError(t, err)
		h, err = limited.HorizonHolder(ctx)
		require.NoError(t, err)
		require.Empty(t, h.Hidden)
		require.Positive(t, h.Age)
		require.Equal(t, "idle in transaction", h.State)
	})
}

func ids(events []eventstore.Event) []string {
	out := []string{}
	for _, e := range events {
		out = append(out, e.ID.String())
	}
	return out
}
