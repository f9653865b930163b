package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// openWriter begins a transaction on db that writes a row of its own (so it holds a transaction
// id, as a projection batch that wrote its read model does), exempt from s's horizon or not.
// The transaction stays open until the test ends.
func openWriter(t *testing.T, db *pgtest.DB, s *postgres.Store, exempt bool) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS read_model (n int)`)
	require.NoError(t, err)
	var opts pgx.TxOptions
	if exempt {
		opts = s.ExemptTxOptions(opts)
	}
	tx, err := db.Pool.BeginTx(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
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
	}, testwait.For(time.Minute), 5*time.Millisecond, "the exempt transaction waits for the holder's row lock")

	after, err := s.Append(ctx, "after", eventstore.Any, storetest.Event("A", 2))
	require.NoError(t, err)
	events, err := s.Read(ctx, before.Last(), eventstore.ReadOptions{})
	require.NoError(t, err)
	require.Empty(t, events, "the holder's open transaction still holds the horizon")

	require.NoError(t, holder.Commit(ctx))
	select {
	case err := <-waited:
		require.NoError(t, err)
	case <-time.After(testwait.For(time.Minute)):
		t.Fatal("the waiter did not get the row lock after the holder committed")
	}
	storetest.Settle(t, s, after.Last())
	events = storetest.ReadAll(t, s, eventstore.ReadOptions{})
	require.Len(t, events, 3)
	require.Equal(t, held.Events[0].ID, events[1].ID, "the holder's event is read before the later one, not skipped")
	require.Equal(t, after.Events[0].ID, events[2].ID)
}

// TestExemptionSurvivesSavepoints: the exemption is declared by BEGIN, at the top level, so a
// rollback to a savepoint cannot end it while the transaction keeps the id it took inside the
// savepoint. Readers pass the transaction; it can never append, so nothing can commit behind
// them. The id is taken in each way a savepoint can give the transaction one.
func TestExemptionSurvivesSavepoints(t *testing.T) {
	t.Parallel()
	pgtest.HoldHorizonTurn(t) // it waits for the horizon with its exempt transaction open
	s, db := newStore(t, postgres.Config{})
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE read_model (n int)`)
	require.NoError(t, err)

	for _, take := range []struct{ name, sql string }{
		{"by a write", `INSERT INTO read_model VALUES (1)`},
		{"by pg_current_xact_id", `SELECT pg_current_xact_id()`},
		{"by a released nested savepoint", `SAVEPOINT inner_sp; INSERT INTO read_model VALUES (2); RELEASE SAVEPOINT inner_sp`},
	} {
		t.Run(take.name, func(t *testing.T) {
			tx, err := db.Pool.BeginTx(ctx, s.ExemptTxOptions(pgx.TxOptions{}))
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, `SAVEPOINT sp`)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, take.sql)
			require.NoError(t, err)
			var xid *uint64
			require.NoError(t, tx.QueryRow(ctx, `SELECT pg_current_xact_id_if_assigned()`).Scan(&xid))
			require.NotNil(t, xid, "the transaction has an id")

			// A reader passes the open exempt transaction.
			later, err := s.Append(ctx, "later-"+take.name, eventstore.Any, storetest.Event("A", 1))
			require.NoError(t, err)
			storetest.Settle(t, s, later.Last())

			_, err = tx.Exec(ctx, `ROLLBACK TO SAVEPOINT sp`)
			require.NoError(t, err)
			_, err = s.AppendTx(ctx, tx, "behind", eventstore.Any, storetest.Event("A", 2))
			require.ErrorIs(t, err, postgres.ErrExempt, "still exempt after the rollback: it cannot append behind the reader")
			var still *uint64
			require.NoError(t, tx.QueryRow(ctx, `SELECT pg_current_xact_id_if_assigned()`).Scan(&still))
			require.Equal(t, xid, still, "the transaction kept its id")
			require.NoError(t, tx.Commit(ctx))
		})
	}
	for _, e := range storetest.ReadAll(t, s, eventstore.ReadOptions{}) {
		require.NotEqual(t, "behind", e.StreamID)
	}
}

// TestExemptionKeyedByTable: two stores over one events table, one naming its schema and one
// using the search path, share the exemption: a transaction exempt through one cannot append
// through the other, and readers of either pass it.
func TestExemptionKeyedByTable(t *testing.T) {
	t.Parallel()
	pgtest.HoldHorizonTurn(t) // it waits for the horizon with its exempt transaction open
	db := pgtest.New(t)
	ctx := context.Background()
	implicit, err := postgres.New(db.Pool, postgres.Config{})
	require.NoError(t, err)
	require.NoError(t, implicit.Migrate(ctx))
	named, err := postgres.New(db.Pool, postgres.Config{Schema: "public"})
	require.NoError(t, err)
	require.NoError(t, named.Migrate(ctx))

	for _, c := range []struct {
		name            string
		exempt, through *postgres.Store
	}{{"exempt by search path, append by name", implicit, named}, {"exempt by name, append by search path", named, implicit}} {
		t.Run(c.name, func(t *testing.T) {
			tx, err := db.Pool.BeginTx(ctx, c.exempt.ExemptTxOptions(pgx.TxOptions{}))
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, `SELECT pg_current_xact_id()`)
			require.NoError(t, err)
			_, err = c.through.AppendTx(ctx, tx, "alias", eventstore.Any, storetest.Event("A", 1))
			require.ErrorIs(t, err, postgres.ErrExempt)

			later, err := c.through.Append(ctx, "later", eventstore.Any, storetest.Event("A", 2))
			require.NoError(t, err)
			storetest.Settle(t, c.through, later.Last()) // readers pass the exempt transaction
		})
	}
}

// TestBeginExemptBatch: a transaction begun by the first statements of a pipelined batch
// (Store.BeginExemptBatch) is exempt as one begun with ExemptTxOptions: while it is open and
// holds a transaction id, a later append becomes readable, and it cannot append itself.
func TestBeginExemptBatch(t *testing.T) {
	t.Parallel()
	pgtest.HoldHorizonTurn(t) // it waits for the horizon with its writer open
	ctx := context.Background()
	s, db := newStore(t, postgres.Config{})
	_, err := db.Pool.Exec(ctx, `CREATE TABLE read_model (n int)`)
	require.NoError(t, err)
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)

	var batch pgx.Batch
	s.BeginExemptBatch(&batch, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	batch.Queue(`INSERT INTO read_model VALUES (1)`) // the transaction takes an id
	results := conn.Conn().SendBatch(ctx, &batch)
	tx := results.Tx()
	require.NoError(t, results.Close())
	defer func() {
		require.NoError(t, tx.Rollback(ctx))
		conn.Release()
	}()
	require.Equal(t, byte('T'), conn.Conn().PgConn().TxStatus(), "inside the transaction")

	res, err := s.Append(ctx, "s", eventstore.Any, storetest.Event("A", 1))
	require.NoError(t, err)
	storetest.Settle(t, s, res.Last()) // other tests' transactions only: never this one
	events, err := s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{})
	require.NoError(t, err)
	require.Len(t, events, 1, "the open exempt transaction holds no reader back")

	_, err = s.AppendTx(ctx, tx, "s", eventstore.Any, storetest.Event("A", 2))
	require.ErrorIs(t, err, postgres.ErrExempt)
}

// exemptHeld reports whether the backend pid holds the exemption lock of the store over
// nudge_events (in the search path), at transaction or session level.
func exemptHeld(t *testing.T, db *pgtest.DB, pid uint32) bool {
	t.Helper()
	var held bool
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_locks
		WHERE pid = $1 AND locktype = 'advisory' AND classid = 1852340846 AND objid = 'nudge_events'::regclass::oid AND objsubid = 2)`,
		pid).Scan(&held))
	return held
}

// lateDeclaration declares the exemption on conn, a connection that may already be inside a
// transaction: through a BEGIN (Store.BeginExemptTx) or a pipelined batch
// (Store.BeginExemptBatch).
type lateDeclaration struct {
	name    string
	declare func(ctx context.Context, s *postgres.Store, conn *pgx.Conn) error
}

var lateDeclarations = []lateDeclaration{
	{"BeginExemptTx", func(ctx context.Context, s *postgres.Store, conn *pgx.Conn) error {
		_, err := s.BeginExemptTx(ctx, conn, pgx.TxOptions{})
		return err
	}},
	{"BeginExemptBatch", func(ctx context.Context, s *postgres.Store, conn *pgx.Conn) error {
		var batch pgx.Batch
		s.BeginExemptBatch(&batch, pgx.TxOptions{})
		return conn.SendBatch(ctx, &batch).Close()
	}},
}

// TestLateExemptionRefused: the exemption can only be declared as the first work of a
// top-level transaction. Declared on a connection whose transaction already appended (its
// BEGIN only draws a warning), or inside a savepoint (a rollback to it would end the exemption
// and keep the transaction's id), it is refused with ErrExemptTooLate and nothing is exempted:
// otherwise a reader passes the transaction and its event, committed later, is never read.
func TestLateExemptionRefused(t *testing.T) {
	t.Parallel()
	for _, d := range lateDeclarations {
		t.Run(d.name+"/after an append", func(t *testing.T) {
			t.Parallel()
			lateAfterAppend(t, d)
		})
		t.Run(d.name+"/in a savepoint", func(t *testing.T) {
			t.Parallel()
			lateInSavepoint(t, d)
		})
		t.Run(d.name+"/after a read", func(t *testing.T) {
			t.Parallel()
			s, db := newStore(t, postgres.Config{})
			ctx := context.Background()
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, `SELECT count(*) FROM nudge_events`)
			require.NoError(t, err)
			err = d.declare(ctx, s, tx.Conn())
			require.ErrorIs(t, err, postgres.ErrExemptTooLate)
			require.False(t, exemptHeld(t, db, tx.Conn().PgConn().PID()), "nothing exempted")
		})
	}
}

// lateAfterAppend: AppendTx("early"), then the declaration on the transaction's connection.
func lateAfterAppend(t *testing.T, d lateDeclaration) {
	s, db := newStore(t, postgres.Config{})
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	early, err := s.AppendTx(ctx, tx, "early", eventstore.Any, storetest.Event("A", 1))
	require.NoError(t, err)

	err = d.declare(ctx, s, tx.Conn())
	if err == nil { // exempted: show what a reader then misses
		assert.Fail(t, "the late declaration was accepted")
		pgtest.HoldHorizonTurn(t)
		later, err := s.Append(ctx, "later", eventstore.Any, storetest.Event("A", 2))
		require.NoError(t, err)
		storetest.Settle(t, s, later.Last()) // the reader passes the open transaction
		require.NoError(t, tx.Commit(ctx))
		require.False(t, early.Last().Less(later.Last()), "%q committed behind a reader that had passed it: it is never read", "early")
		return
	}
	require.ErrorIs(t, err, postgres.ErrExemptTooLate)
	require.False(t, exemptHeld(t, db, tx.Conn().PgConn().PID()), "nothing exempted")
	require.ErrorIs(t, tx.Commit(ctx), pgx.ErrTxCommitRollback, "the transaction is aborted")
	require.Empty(t, storetest.ReadAll(t, s, eventstore.ReadOptions{}))
}

// lateInSavepoint: the declaration in a savepoint; the transaction takes an id, a reader
// passes it, the rollback to the savepoint ends the exemption and the id stays, then AppendTx.
func lateInSavepoint(t *testing.T, d lateDeclaration) {
	s, db := newStore(t, postgres.Config{})
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE read_model (n int)`)
	require.NoError(t, err)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	sp, err := tx.Begin(ctx)
	require.NoError(t, err)

	err = d.declare(ctx, s, sp.Conn())
	if err == nil { // exempted: show what a reader then misses
		assert.Fail(t, "the declaration in a savepoint was accepted")
		pgtest.HoldHorizonTurn(t)
		_, err = sp.Exec(ctx, `INSERT INTO read_model VALUES (1)`) // the transaction takes an id
		require.NoError(t, err)
		later, err := s.Append(ctx, "later", eventstore.Any, storetest.Event("A", 1))
		require.NoError(t, err)
		storetest.Settle(t, s, later.Last())
		require.NoError(t, sp.Rollback(ctx)) // ROLLBACK TO SAVEPOINT: the exemption ends, the id stays
		behind, err := s.AppendTx(ctx, tx, "behind", eventstore.Any, storetest.Event("A", 2))
		if err == nil {
			require.NoError(t, tx.Commit(ctx))
			require.False(t, behind.Last().Less(later.Last()), "%q committed behind a reader that had passed it: it is never read", "behind")
		}
		return
	}
	require.ErrorIs(t, err, postgres.ErrExemptTooLate)
	require.False(t, exemptHeld(t, db, tx.Conn().PgConn().PID()), "nothing exempted")
	require.ErrorIs(t, tx.Commit(ctx), pgx.ErrTxCommitRollback, "the transaction is aborted")
}

// TestAppendRefusedWhileExempt: AppendTx refuses to append in any transaction whose backend
// holds the exemption lock, however it was taken and whatever the transaction's settings say:
// readers pass such a transaction, so an event it appended could commit behind them.
func TestAppendRefusedWhileExempt(t *testing.T) {
	t.Parallel()
	const rawLock = `SELECT pg_advisory_xact_lock_shared(1852340846, ('nudge_events'::regclass::oid)::int4)`
	for _, c := range []struct {
		name  string
		begin func(ctx context.Context, t *testing.T, s *postgres.Store, conn *pgx.Conn) pgx.Tx
	}{
		{"declared, then RESET ALL", func(ctx context.Context, t *testing.T, s *postgres.Store, conn *pgx.Conn) pgx.Tx {
			tx, err := s.BeginExemptTx(ctx, conn, pgx.TxOptions{})
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `RESET ALL`)
			require.NoError(t, err)
			return tx
		}},
		{"transaction lock taken by SQL", func(ctx context.Context, t *testing.T, s *postgres.Store, conn *pgx.Conn) pgx.Tx {
			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, rawLock)
			require.NoError(t, err)
			return tx
		}},
		{"session lock", func(ctx context.Context, t *testing.T, s *postgres.Store, conn *pgx.Conn) pgx.Tx {
			_, err := conn.Exec(ctx, `SELECT pg_advisory_lock_shared(1852340846, ('nudge_events'::regclass::oid)::int4)`)
			require.NoError(t, err)
			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			return tx
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s, db := newStore(t, postgres.Config{})
			ctx := context.Background()
			pc, err := db.Pool.Acquire(ctx)
			require.NoError(t, err)
			conn := pc.Hijack() // the session may hold the lock: never back to the pool
			defer func() { _ = conn.Close(ctx) }()
			tx := c.begin(ctx, t, s, conn)
			defer func() { _ = tx.Rollback(ctx) }()
			require.True(t, exemptHeld(t, db, conn.PgConn().PID()), "readers take the transaction for exempt")
			_, err = s.AppendTx(ctx, tx, "s", eventstore.Any, storetest.Event("A", 1))
			require.ErrorIs(t, err, postgres.ErrExempt)
		})
	}
}
