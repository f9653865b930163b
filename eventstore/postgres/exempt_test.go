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
	"github.com/nudgeworks/nudge/internal/pgtest"
)

// openWriter begins a transaction on db that writes a row of its own (so it holds a transaction
// id, as a projection batch that wrote its read model does), exempt from s's horizon or not.
// The transaction stays open until the test ends.
func openWriter(t *testing.T, db *pgtest.DB, s *postgres.Store, exempt bool) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS read_model (n int)`)
	require.NoError(t, err)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if exempt {
		require.NoError(t, s.Exempt(ctx, tx))
	}
	_, err = tx.Exec(ctx, `INSERT INTO read_model VALUES (1)`)
	require.NoError(t, err)
	return tx
}

// TestExemptTransactionDoesNotHoldReaders: an open writing transaction holds readers back
// (events committed after it stay unreadable), unless it is exempt: then the event becomes
// readable while it is still open.
func TestExemptTransactionDoesNotHoldReaders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("not exempt", func(t *testing.T) {
		t.Parallel()
		s, db := newStore(t, postgres.Config{})
		openWriter(t, db, s, false)
		res, err := s.Append(ctx, "s", eventstore.Any, storetest.Event("A", 1))
		require.NoError(t, err)
		events, err := s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{})
		require.NoError(t, err)
		require.Empty(t, events, "the open writer holds the reader back")
		head, err := s.Head(ctx)
		require.NoError(t, err)
		require.True(t, head.Less(res.Last()))
	})

	t.Run("exempt", func(t *testing.T) {
		t.Parallel()
		pgtest.HoldHorizonTurn(t) // it waits for the horizon with its writer open
		s, db := newStore(t, postgres.Config{})
		openWriter(t, db, s, true)
		res, err := s.Append(ctx, "s", eventstore.Any, storetest.Event("A", 1))
		require.NoError(t, err)
		// Transactions of other tests on the same server hold the horizon for moments too:
		// wait for them, never for the exempt writer, which stays open.
		storetest.Settle(t, s, res.Last())
		events, err := s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{})
		require.NoError(t, err)
		require.Len(t, events, 1)
		require.Equal(t, res.Events[0].ID, events[0].ID)
	})
}

// TestAppendInExemptTransactionFails: an exempt transaction cannot append to the store it is
// exempt for (readers would not wait for its events); it writes nothing and the transaction
// stays usable. The exemption is the store's schema's only: appending to a store in another
// schema works, and that store's readers wait for the transaction.
func TestAppendInExemptTransactionFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	a, err := postgres.New(db.Pool, postgres.Config{Schema: "a"})
	require.NoError(t, err)
	require.NoError(t, a.Migrate(ctx))
	b, err := postgres.New(db.Pool, postgres.Config{Schema: "b"})
	require.NoError(t, err)
	require.NoError(t, b.Migrate(ctx))

	tx := openWriter(t, db, a, true)
	_, err = a.AppendTx(ctx, tx, "s", eventstore.Any, storetest.Event("A", 1))
	require.ErrorIs(t, err, postgres.ErrExempt)
	_, err = b.AppendTx(ctx, tx, "s", eventstore.Any, storetest.Event("B", 1))
	require.NoError(t, err, "the transaction is usable and may append to another schema's store")

	later, err := b.Append(ctx, "t", eventstore.Any, storetest.Event("B", 2))
	require.NoError(t, err)
	events, err := b.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{})
	require.NoError(t, err)
	require.Empty(t, events, "b's readers wait for the transaction that appends to b")

	require.NoError(t, tx.Commit(ctx))
	storetest.Settle(t, b, later.Last())
	require.Len(t, storetest.ReadAll(t, b, eventstore.ReadOptions{}), 2)
	require.Empty(t, storetest.ReadAll(t, a, eventstore.ReadOptions{}), "nothing was appended to a")

	require.ErrorContains(t, a.Exempt(ctx, nil), "nil transaction")
}

// TestExemptWaiterDoesNotHideTheHolder: an exempt transaction waiting for a row lock of an
// appender shows the appender's transaction id in pg_locks too (as a lock it waits for); the
// appender must still hold the horizon, or an event committed after it would be read first and
// the appender's event skipped.
func TestExemptWaiterDoesNotHideTheHolder(t *testing.T) {
	t.Parallel()
	pgtest.HoldHorizonTurn(t) // it waits for the horizon with the waiter open
	s, db := newStore(t, postgres.Config{})
	ctx := context.Background()

	before, err := s.Append(ctx, "held", eventstore.Any, storetest.Event("A", 0))
	require.NoError(t, err)
	storetest.Settle(t, s, before.Last())
	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	held, err := s.AppendTx(ctx, holder, "held", eventstore.Any, storetest.Event("A", 1))
	require.NoError(t, err, "the holder locks the stream's row")

	waiter := openWriter(t, db, s, true)
	var waiterPID uint32
	require.NoError(t, waiter.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&waiterPID))
	waited := make(chan error, 1)
	go func() {
		_, err := waiter.Exec(ctx, `SELECT version FROM nudge_streams WHERE stream_id = 'held' FOR UPDATE`)
		waited <- err
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND locktype = 'transactionid' AND NOT granted)`,
			waiterPID).Scan(&waiting)
		return err == nil && waiting
	}, 10*time.Second, 5*time.Millisecond, "the exempt transaction waits for the holder's row lock")

	after, err := s.Append(ctx, "after", eventstore.Any, storetest.Event("A", 2))
	require.NoError(t, err)
	events, err := s.Read(ctx, before.Last(), eventstore.ReadOptions{})
	require.NoError(t, err)
	require.Empty(t, events, "the holder's open transaction still holds the horizon")

	require.NoError(t, holder.Commit(ctx))
	select {
	case err := <-waited:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not get the row lock after the holder committed")
	}
	storetest.Settle(t, s, after.Last())
	events = storetest.ReadAll(t, s, eventstore.ReadOptions{})
	require.Len(t, events, 3)
	require.Equal(t, held.Events[0].ID, events[1].ID, "the holder's event is read before the later one, not skipped")
	require.Equal(t, after.Events[0].ID, events[2].ID)
}

// TestExemptAfterAWriteIsRefused: a transaction that has written something may have appended
// events, so it cannot be exempted; the refusal takes nothing, and readers keep waiting for it.
func TestExemptAfterAWriteIsRefused(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, postgres.Config{})
	ctx := context.Background()
	tx := openWriter(t, db, s, false)
	_, err := s.AppendTx(ctx, tx, "early", eventstore.Any, storetest.Event("A", 1))
	require.NoError(t, err)
	require.ErrorIs(t, s.Exempt(ctx, tx), postgres.ErrExemptTooLate)

	later, err := s.Append(ctx, "later", eventstore.Any, storetest.Event("A", 2))
	require.NoError(t, err)
	events, err := s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{})
	require.NoError(t, err)
	require.Empty(t, events, "the refused transaction still holds the horizon")
	_, err = s.AppendTx(ctx, tx, "early", eventstore.Any, storetest.Event("A", 3))
	require.NoError(t, err, "and may still append")

	require.NoError(t, tx.Commit(ctx))
	storetest.Settle(t, s, later.Last())
	require.Len(t, storetest.ReadAll(t, s, eventstore.ReadOptions{}), 3)
}
