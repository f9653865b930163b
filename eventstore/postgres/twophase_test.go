package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/pgcluster"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// TestTwoPhaseCommit: a transaction that appends can be prepared (PREPARE TRANSACTION) when
// AllowPrepareTx came before its AppendTx; without it PostgreSQL refuses, the store's trigger
// having notified in it. While prepared, the transaction holds readers back (HorizonHolder names
// it); after COMMIT PREPARED its event is read before a later one, never skipped. The shared
// server allows no prepared transactions: the test runs on a private cluster.
func TestTwoPhaseCommit(t *testing.T) {
	c := pgcluster.ForTestWith(t, pgcluster.Options{MaxPreparedTransactions: 2})
	ctx := testwait.Context(t, 2*time.Minute)
	pool, err := pgxpool.New(ctx, c.URL("postgres", ""))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := postgres.New(pool, postgres.Config{})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	conn, err := pgx.Connect(ctx, c.URL("postgres", ""))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })

	t.Run("without AllowPrepareTx", func(t *testing.T) {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = s.AppendTx(ctx, tx, "refused", eventstore.Any, storetest.Event("A", 0))
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `PREPARE TRANSACTION 'nudge-refused'`)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "0A000", pgErr.Code, "PostgreSQL cannot prepare a transaction that notified: %v", err)
	})

	t.Run("with AllowPrepareTx", func(t *testing.T) {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, s.AllowPrepareTx(ctx, tx))
		prepared, err := s.AppendTx(ctx, tx, "prepared", eventstore.Any, storetest.Event("A", 1))
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `PREPARE TRANSACTION 'nudge-2pc'`)
		require.NoError(t, err)
		defer func() { _, _ = pool.Exec(context.Background(), `ROLLBACK PREPARED 'nudge-2pc'`) }()

		later, err := s.Append(ctx, "later", eventstore.Any, storetest.Event("A", 2))
		require.NoError(t, err)
		events, err := s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{})
		require.NoError(t, err)
		require.Empty(t, events, "the prepared transaction holds readers back")
		holder, err := s.HorizonHolder(ctx)
		require.NoError(t, err)
		require.NotNil(t, holder)
		require.Equal(t, "nudge-2pc", holder.PreparedGID)

		_, err = pool.Exec(ctx, `COMMIT PREPARED 'nudge-2pc'`)
		require.NoError(t, err)
		storetest.Settle(t, s, later.Last())
		all := storetest.ReadAll(t, s, eventstore.ReadOptions{})
		require.Len(t, all, 2)
		require.Equal(t, prepared.Events[0].ID, all[0].ID, "the prepared transaction's event, then the later one")
		require.Equal(t, later.Events[0].ID, all[1].ID)
	})
}
