package postgres_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/testwait"
	nudgepg "github.com/nudgeworks/nudge/postgres"
)

// TestStreamOrderGuard builds the interleaving that would invert a stream's order: transaction A
// gets its id from an earlier write, transaction B (younger) appends version 1 of a stream and
// commits, then A appends to the same stream. Ordered by transaction id, A's version 2 would be
// read before B's version 1. The append must refuse with a retryable conflict; a retry succeeds.
func TestStreamOrderGuard(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, postgres.Config{})
	ctx := context.Background()

	txA, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = txA.Rollback(ctx) }()
	_, err = s.AppendTx(ctx, txA, "elsewhere", eventstore.Any, storetest.Event("Earlier", 1))
	require.NoError(t, err, "A now holds a transaction id")

	b, err := s.Append(ctx, "ticket", eventstore.NoStream, storetest.Event("Registered", 1))
	require.NoError(t, err)

	_, err = s.AppendTx(ctx, txA, "ticket", eventstore.Exact(1), storetest.Event("Closed", 2))
	require.ErrorIs(t, err, eventstore.ErrConflict)
	var ce *eventstore.ConflictError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, eventstore.ConflictStreamOrder, ce.Reason)
	require.Equal(t, "ticket", ce.StreamID)
	require.Contains(t, err.Error(), "retry the transaction")
	require.NoError(t, txA.Rollback(ctx))

	// The retry runs in a new transaction, with a newer id: it succeeds and the order holds.
	retry, err := s.Append(ctx, "ticket", eventstore.Exact(1), storetest.Event("Closed", 2))
	require.NoError(t, err)
	storetest.Settle(t, s, retry.Last())
	all := storetest.ReadAll(t, s, eventstore.ReadOptions{})
	require.Len(t, all, 2, "the rolled-back transaction left nothing")
	require.Equal(t, b.Events[0].ID, all[0].ID)
	require.Equal(t, int64(1), all[0].StreamVersion)
	require.Equal(t, int64(2), all[1].StreamVersion)
}

// TestStreamOrderGuardAllowsOwnTransaction: appending twice to one stream in one transaction, or
// to a stream whose last append is older, is no conflict.
func TestStreamOrderGuardAllowsOwnTransaction(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, postgres.Config{})
	ctx := context.Background()
	_, err := s.Append(ctx, "old", eventstore.Any, storetest.Event("A", 1))
	require.NoError(t, err)

	var last eventstore.Position
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		for i := range 3 {
			res, err := s.AppendTx(ctx, tx, "mine", eventstore.Exact(int64(i)), storetest.Event("A", i))
			if err != nil {
				return err
			}
			last = res.Last()
		}
		_, err := s.AppendTx(ctx, tx, "old", eventstore.Exact(1), storetest.Event("A", 2))
		return err
	})
	require.NoError(t, err)
	storetest.Settle(t, s, last)
	require.Len(t, storetest.ReadAll(t, s, eventstore.ReadOptions{}), 5)
}

// TestHorizonWaitsForOpenTransaction: an event inserted earlier (smaller global position) but
// committed later is read in order, never skipped. The naive reader skips it.
func TestHorizonWaitsForOpenTransaction(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, postgres.Config{})
	ctx := context.Background()

	slow, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = slow.Rollback(ctx) }()
	late, err := s.AppendTx(ctx, slow, "slow", eventstore.Any, storetest.Event("A", 1))
	require.NoError(t, err)
	fast, err := s.Append(ctx, "fast", eventstore.Any, storetest.Event("A", 2))
	require.NoError(t, err)
	require.Less(t, late.Events[0].Position.GlobalPosition, fast.Events[0].Position.GlobalPosition)

	// While the slow transaction is open nothing after it is readable, not even the committed
	// fast event; the naive reader takes the fast event and moves past the slow one.
	events, err := s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{})
	require.NoError(t, err)
	require.Empty(t, events)
	head, err := s.Head(ctx)
	require.NoError(t, err)
	require.True(t, head.Less(late.Last()), "the head stays before the open transaction")
	naiveIDs, naivePos, err := naiveRead(ctx, db.Pool, 0)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{fast.Events[0].ID}, naiveIDs)

	require.NoError(t, slow.Commit(ctx))
	storetest.Settle(t, s, fast.Last())
	events = storetest.ReadAll(t, s, eventstore.ReadOptions{})
	require.Len(t, events, 2)
	require.Equal(t, late.Events[0].ID, events[0].ID, "the older transaction reads first")
	require.Equal(t, fast.Events[0].ID, events[1].ID)

	naiveIDs, _, err = naiveRead(ctx, db.Pool, naivePos)
	require.NoError(t, err)
	require.Empty(t, naiveIDs, "the naive reader has skipped the late commit for good")
}

// TestAppendTxIsAtomicWithCallerRows: events and the caller's own rows commit or roll back
// together.
func TestAppendTxIsAtomicWithCallerRows(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, postgres.Config{})
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY)`)
	require.NoError(t, err)

	write := func(id string) func(pgx.Tx) error {
		return func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, id); err != nil {
				return err
			}
			_, err := s.AppendTx(ctx, tx, "order-"+id, eventstore.NoStream, storetest.Event("OrderPlaced", 1))
			return err
		}
	}
	rollback := errors.New("changed my mind")
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if err := write("a")(tx); err != nil {
			return err
		}
		return rollback
	})
	require.ErrorIs(t, err, rollback)
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, write("b")))

	var orders int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders))
	require.Equal(t, 1, orders)
	a, err := s.ReadStream(ctx, "order-a", 0, 0)
	require.NoError(t, err)
	require.Empty(t, a)
	b, err := s.ReadStream(ctx, "order-b", 0, 0)
	require.NoError(t, err)
	require.Len(t, b, 1)
}

// TestAppendTxRefusalLeavesTransactionUsable: a refused append writes nothing and does not
// poison the caller's transaction.
func TestAppendTxRefusalLeavesTransactionUsable(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, postgres.Config{})
	ctx := context.Background()
	existing, err := s.Append(ctx, "s", eventstore.Any, storetest.Event("A", 1))
	require.NoError(t, err)

	var last eventstore.Position
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := s.AppendTx(ctx, tx, "s", eventstore.NoStream, storetest.Event("A", 2))
		require.ErrorIs(t, err, eventstore.ErrWrongExpectedVersion)
		_, err = s.AppendTx(ctx, tx, "", eventstore.Any, storetest.Event("A", 2))
		require.ErrorIs(t, err, eventstore.ErrInvalidInput)
		dup := storetest.Event("A", 3)
		dup.ID = existing.Events[0].ID
		_, err = s.AppendTx(ctx, tx, "t", eventstore.Any, dup)
		require.ErrorIs(t, err, eventstore.ErrDuplicateEvent)
		res, err := s.AppendTx(ctx, tx, "s", eventstore.Exact(1), storetest.Event("A", 2))
		last = res.Last()
		return err
	})
	require.NoError(t, err)
	storetest.Settle(t, s, last)
	all := storetest.ReadAll(t, s, eventstore.ReadOptions{})
	require.Len(t, all, 2)

	_, err = s.AppendTx(ctx, nil, "s", eventstore.Any, storetest.Event("A", 1))
	require.ErrorIs(t, err, eventstore.ErrInvalidInput)
	_, err = s.ReadTx(ctx, nil, eventstore.Position{}, eventstore.ReadOptions{})
	require.ErrorIs(t, err, eventstore.ErrInvalidInput)
}

// TestRacingCreatorsOfOneStream: many appenders create the same stream with NoStream at once;
// exactly one wins, the others get ErrWrongExpectedVersion (not a raw database error).
func TestRacingCreatorsOfOneStream(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, postgres.Config{})
	ctx := context.Background()
	const n = 8
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		errs  = make([]error, n)
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = s.Append(ctx, "contested", eventstore.NoStream, storetest.Event("Created", i))
		}()
	}
	close(start)
	wg.Wait()
	wins := 0
	for _, err := range errs {
		if err == nil {
			wins++
			continue
		}
		require.ErrorIs(t, err, eventstore.ErrWrongExpectedVersion)
	}
	require.Equal(t, 1, wins)
	events, err := s.ReadStream(ctx, "contested", 0, 0)
	require.NoError(t, err)
	require.Len(t, events, 1)
}

// TestRacingRepeatsOfOneAppend: the same append (same ids) sent by several goroutines at once,
// as retries after a timeout do, stores the events once; every call succeeds.
func TestRacingRepeatsOfOneAppend(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, postgres.Config{})
	ctx := context.Background()
	events := []eventstore.EventData{storetest.Event("A", 1), storetest.Event("B", 2)}
	events[0].ID, events[1].ID = uuid.New(), uuid.New()
	const n = 8
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		results = make([]eventstore.AppendResult, n)
		errs    = make([]error, n)
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = s.Append(ctx, "repeated", eventstore.NoStream, events...)
		}()
	}
	close(start)
	wg.Wait()
	fresh := 0
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, int64(2), results[i].StreamVersion)
		if !results[i].Idempotent {
			fresh++
		}
	}
	require.Equal(t, 1, fresh, "one call wrote, the others found its events")
	stored, err := s.ReadStream(ctx, "repeated", 0, 0)
	require.NoError(t, err)
	require.Len(t, stored, 2)
}

func TestClosedPool(t *testing.T) {
	t.Parallel()
	_, db := newStore(t, postgres.Config{})
	pool := db.NewPool(t, 2)
	s, err := postgres.New(pool, postgres.Config{})
	require.NoError(t, err)
	pool.Close()
	ctx := context.Background()

	_, err = s.Append(ctx, "s", eventstore.Any, storetest.Event("A", 1))
	require.ErrorIs(t, err, eventstore.ErrClosed)
	require.Contains(t, err.Error(), "closed")
	_, err = s.Read(ctx, eventstore.Position{}, eventstore.ReadOptions{})
	require.ErrorIs(t, err, eventstore.ErrClosed)
	_, err = s.ReadStream(ctx, "s", 0, 0)
	require.ErrorIs(t, err, eventstore.ErrClosed)
	_, err = s.Head(ctx)
	require.ErrorIs(t, err, eventstore.ErrClosed)
	require.ErrorIs(t, s.Migrate(ctx), eventstore.ErrClosed)
}

// TestConfig: WithDefaults fills every default; New refuses a nil database and a Config that
// cannot work with an error matching ErrInvalidConfig that names the field.
func TestConfig(t *testing.T) {
	t.Parallel()
	cfg := postgres.Config{}.WithDefaults()
	require.Equal(t, postgres.AppendAttemptsDefault, cfg.AppendAttempts)
	require.Equal(t, eventstore.Limits{}.WithDefaults(), cfg.Limits)
	require.NoError(t, cfg.Validate())

	_, err := postgres.New(nil, postgres.Config{})
	require.ErrorIs(t, err, postgres.ErrInvalidConfig)
	require.ErrorContains(t, err, "nil")
	db := struct{ nudgepg.DB }{}
	for _, schema := range []string{"Bad", "1abc", "a-b", `x"; DROP TABLE y; --`, "a b"} {
		_, err = postgres.New(db, postgres.Config{Schema: schema})
		require.ErrorIs(t, err, postgres.ErrInvalidConfig, schema)
		require.ErrorIs(t, err, nudgepg.ErrInvalidSchema, schema)
		require.ErrorContains(t, err, "lowercase letters", schema)
	}
	cases := map[string]postgres.Config{
		"AppendAttempts -1":        {AppendAttempts: -1},
		"Limits.MaxEventBytes: -1": {Limits: eventstore.Limits{MaxEventBytes: -1}},
	}
	for want, bad := range cases {
		_, err = postgres.New(db, bad)
		require.ErrorIs(t, err, postgres.ErrInvalidConfig, want)
		require.ErrorContains(t, err, want)
	}
}

// TestCancelledMidAppend: a context cancelled while the append waits for a stream lock ends the
// call with context.Canceled and writes nothing.
func TestCancelledMidAppend(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, postgres.Config{})
	ctx := context.Background()
	_, err := s.Append(ctx, "locked", eventstore.Any, storetest.Event("A", 1))
	require.NoError(t, err)

	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = s.AppendTx(ctx, holder, "locked", eventstore.Any, storetest.Event("A", 2))
	require.NoError(t, err, "holder now has the stream's lock")

	waiting, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := s.Append(waiting, "locked", eventstore.Any, storetest.Event("A", 3))
		done <- err
	}()
	require.Eventually(t, func() bool {
		var waiters int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiters))
		return waiters == 1
	}, testwait.For(time.Minute), 5*time.Millisecond)
	cancel()
	err = <-done
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, holder.Rollback(ctx))

	events, err := s.ReadStream(ctx, "locked", 0, 0)
	require.NoError(t, err)
	require.Len(t, events, 1)
}
