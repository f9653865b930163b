package postgres_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/postgres"
)

// roundTrips records what each round trip of a pool sent: a statement of its own, or the
// statements of a pipelined batch.
type roundTrips struct {
	mu    sync.Mutex
	trips [][]string
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	r.add([]string{data.SQL})
	return ctx
}

func (*roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	var sqls []string
	for _, q := range data.Batch.QueuedQueries {
		sqls = append(sqls, q.SQL)
	}
	r.add(sqls)
	return ctx
}

func (*roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (*roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (r *roundTrips) add(sqls []string) {
	r.mu.Lock()
	r.trips = append(r.trips, sqls)
	r.mu.Unlock()
}

// since returns the round trips recorded after the first n.
func (r *roundTrips) since(n int) [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]string(nil), r.trips[n:]...)
}

func (r *roundTrips) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.trips)
}

// openBackend returns a pool on a new database, configured by configure (if not nil), and a
// migrated store and backend on it.
func openBackend(t *testing.T, configure func(*pgxpool.Config)) (*pgxpool.Pool, *espg.Store, *postgres.Backend) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.New(t).URL)
	require.NoError(t, err)
	if configure != nil {
		configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := espg.New(pool, espg.Config{})
	require.NoError(t, err)
	b, err := postgres.New(store)
	require.NoError(t, err)
	require.NoError(t, store.Migrate(context.Background()))
	require.NoError(t, b.Migrate(context.Background()))
	return pool, store, b
}

// TestBatchBeginsInItsLockRoundTripAndCommitsInItsLast: on a pool, a batch's BEGIN — and, for
// a projection that appends no events, the declaration that exempts it from the store's
// horizon — goes in the round trip that takes its lock, and its COMMIT in the round trip that
// advances its position: no round trip begins or commits the transaction alone.
func TestBatchBeginsInItsLockRoundTripAndCommitsInItsLast(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(time.Minute))
	defer cancel()
	trips := &roundTrips{}
	_, store, b := openBackend(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = trips })

	for _, appends := range []bool{false, true} {
		name := "tickets"
		if appends {
			name = "appending"
		}
		var handled atomic.Int64
		p, err := projection.New(name, projection.Config{AppendsEvents: appends}, projection.On("TicketWasRegistered",
			func(context.Context, pgx.Tx, projection.Event[registered]) error { handled.Add(1); return nil }))
		require.NoError(t, err)
		r := runner(t, b, p)
		appendNumbers(t, store, 1, 1)
		from := trips.len()
		for handled.Load() == 0 { // the event may not be readable at once (see catchUpUntil)
			_, err := r.CatchUp(ctx, name)
			require.NoError(t, err)
			require.NoError(t, ctx.Err())
		}

		var (
			locks, advances [][]string
			commitsAlone    int
		)
		for _, trip := range trips.since(from) {
			require.False(t, strings.HasPrefix(strings.ToLower(trip[0]), "begin") && len(trip) == 1,
				"a round trip of BEGIN alone (appends %v): %q", appends, trip)
			if strings.EqualFold(trip[0], "commit") && len(trip) == 1 {
				commitsAlone++
			}
			if strings.HasPrefix(trip[0], "UPDATE nudge_projections SET") {
				advances = append(advances, trip)
			}
			for i, sql := range trip {
				if strings.HasPrefix(sql, "SELECT pg_advisory_xact_lock(") && strings.Contains(sql, "hashtext(") {
					locks = append(locks, trip[:i+1])
				}
			}
		}
		require.NotEmpty(t, locks, "appends %v", appends)
		for _, lock := range locks {
			require.Equal(t, "begin isolation level read committed", strings.ToLower(lock[0]), "appends %v", appends)
			exempt := strings.Contains(lock[len(lock)-2], "pg_advisory_xact_lock_shared(")
			require.Equal(t, !appends, exempt, "the exemption is declared right after BEGIN unless the projection appends: %q", lock)
			require.Len(t, lock, map[bool]int{true: 4, false: 2}[exempt], "BEGIN, the exemption (its guard, its lock) if any, then the lock: %q", lock)
		}
		require.NotEmpty(t, advances, "appends %v", appends)
		for _, trip := range advances {
			require.Equal(t, []string{"commit"}, trip[1:], "the position's advance, then COMMIT (appends %v)", appends)
		}
		require.Equal(t, len(locks)-len(advances), commitsAlone,
			"only a batch that found nothing to do (no advance) commits alone (appends %v)", appends)
	}
}

// TestFailedLockRoundTripLeavesThePoolClean: a batch whose first round trip fails (its
// projection's status row is gone) fails with the typed error, and the connection it ran on
// goes back to the pool outside any transaction: the next batches run.
func TestFailedLockRoundTripLeavesThePoolClean(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(time.Minute))
	defer cancel()
	pool, store, b := openBackend(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 }) // every batch on the one connection
	p, seen := handledBy(t, "tickets")
	r := runner(t, b, p)
	appendNumbers(t, store, 1, 2)

	_, err := pool.Exec(ctx, "DELETE FROM nudge_projections WHERE name = 'tickets'")
	require.NoError(t, err)
	_, err = r.CatchUp(ctx, "tickets")
	require.ErrorIs(t, err, projection.ErrNotRegistered)
	require.Empty(t, seen())

	require.NoError(t, r.Init(ctx)) // registers it again, on the same connection
	catchUpUntil(ctx, t, r, 2, seen)
	require.Equal(t, []int{1, 2}, seen())
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	require.Equal(t, byte('I'), c.Conn().PgConn().TxStatus(), "the connection is outside a transaction")
}

// TestHandlersTxIsClosedAfterTheBatch: a handler that keeps the batch's transaction (a
// goroutine it started, say) cannot use it once the batch has committed — every method
// returns pgx.ErrTxClosed, nested transactions' too — and so cannot run a statement on the
// connection, which serves other batches by then.
func TestHandlersTxIsClosedAfterTheBatch(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(time.Minute))
	defer cancel()
	_, store, b := openBackend(t, nil)
	var (
		mu   sync.Mutex
		kept []pgx.Tx
	)
	p, err := projection.New("tickets", projection.Config{}, projection.On("TicketWasRegistered",
		func(ctx context.Context, tx pgx.Tx, _ projection.Event[registered]) error {
			nested, err := tx.Begin(ctx) // a savepoint, released at once
			if err != nil {
				return err
			}
			if err := nested.Commit(ctx); err != nil {
				return err
			}
			mu.Lock()
			kept = append(kept, tx, nested)
			mu.Unlock()
			return nil
		}))
	require.NoError(t, err)
	r := runner(t, b, p)
	appendNumbers(t, store, 1, 1)
	for {
		mu.Lock()
		n := len(kept)
		mu.Unlock()
		if n > 0 {
			break
		}
		_, err := r.CatchUp(ctx, "tickets")
		require.NoError(t, err)
		require.NoError(t, ctx.Err())
	}
	st, err := r.Status(ctx, "tickets")
	require.NoError(t, err)
	require.EqualValues(t, 1, st.EventsProcessed, "the batch committed")

	for _, tx := range kept {
		_, err := tx.Exec(ctx, "SELECT 1")
		require.ErrorIs(t, err, pgx.ErrTxClosed)
		rows, err := tx.Query(ctx, "SELECT 1")
		require.ErrorIs(t, err, pgx.ErrTxClosed)
		require.False(t, rows.Next())
		require.ErrorIs(t, rows.Err(), pgx.ErrTxClosed)
		var one int
		require.ErrorIs(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), pgx.ErrTxClosed)
		require.ErrorIs(t, tx.SendBatch(ctx, &pgx.Batch{}).Close(), pgx.ErrTxClosed)
		_, err = tx.Begin(ctx)
		require.ErrorIs(t, err, pgx.ErrTxClosed)
		require.ErrorIs(t, tx.Commit(ctx), pgx.ErrTxClosed)
		require.ErrorIs(t, tx.Rollback(ctx), pgx.ErrTxClosed)
		require.Nil(t, tx.Conn())
	}
}

// TestCommitThatFailsKeepsThePosition: a batch whose COMMIT fails (a deferred constraint its
// handler broke, checked at COMMIT, which goes in one round trip with the position's advance)
// fails, commits nothing and keeps the position; once the data is fixed the next catch-up
// handles the event.
func TestCommitThatFailsKeepsThePosition(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(time.Minute))
	defer cancel()
	pool, store, b := openBackend(t, nil)
	_, err := pool.Exec(ctx, `CREATE TABLE owners (id int PRIMARY KEY);
		CREATE TABLE tickets (n int PRIMARY KEY, owner int NOT NULL REFERENCES owners DEFERRABLE INITIALLY DEFERRED)`)
	require.NoError(t, err)
	p, err := projection.New("tickets", projection.Config{}, projection.On("TicketWasRegistered",
		func(ctx context.Context, tx pgx.Tx, e projection.Event[registered]) error {
			_, err := tx.Exec(ctx, "INSERT INTO tickets (n, owner) VALUES ($1, 7)", e.Data.N)
			return err // the missing owner 7 is found at COMMIT
		}))
	require.NoError(t, err)
	r := runner(t, b, p)
	data, err := eventstore.NewEventData("TicketWasRegistered", registered{N: 1, Label: "ok"})
	require.NoError(t, err)
	appended, err := store.Append(ctx, "t-1", eventstore.Any, data)
	require.NoError(t, err)
	storetest.Settle(t, store, appended.Last()) // readable: the first catch-up handles it

	_, err = r.CatchUp(ctx, "tickets")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the COMMIT fails")
	require.Equal(t, "23503", pgErr.Code, "a foreign key violation")
	st, err := r.Status(ctx, "tickets")
	require.NoError(t, err)
	require.True(t, st.Position.IsZero(), "the position stays: %s", st.Position)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM tickets").Scan(&n))
	require.Zero(t, n, "nothing committed")

	_, err = pool.Exec(ctx, "INSERT INTO owners VALUES (7)")
	require.NoError(t, err)
	res, err := r.CatchUp(ctx, "tickets")
	require.NoError(t, err)
	require.Equal(t, 1, res.Events)
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM tickets").Scan(&n))
	require.Equal(t, 1, n)
}

// TestBatchOnASingleConnection: on a database that is not a pool (one *pgx.Conn), batches
// begin and commit in round trips of their own, and work the same.
func TestBatchOnASingleConnection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(time.Minute))
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.New(t).URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
	store, err := espg.New(conn, espg.Config{})
	require.NoError(t, err)
	b, err := postgres.New(store)
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	require.NoError(t, b.Migrate(ctx))
	p, seen := handledBy(t, "tickets")
	r := runner(t, b, p)

	appendNumbers(t, store, 1, 3)
	catchUpUntil(ctx, t, r, 3, seen)
	require.Equal(t, []int{1, 2, 3}, seen())
	st, err := r.Status(ctx, "tickets")
	require.NoError(t, err)
	require.EqualValues(t, 3, st.EventsProcessed)
	require.Equal(t, byte('I'), conn.PgConn().TxStatus())
}

// TestQueuedBatchTakesTwoRoundTrips: on a pool, a batch of an OnQueued projection without a
// flush hook is two round trips — BEGIN, the lock and the read; then the handlers' statements,
// the position's advance and COMMIT — while with a flush hook the statements go before the
// hook, which sees what they wrote.
func TestQueuedBatchTakesTwoRoundTrips(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(time.Minute))
	defer cancel()
	trips := &roundTrips{}
	pool, store, b := openBackend(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = trips })
	_, err := pool.Exec(ctx, "CREATE TABLE seen (projection text, n int, PRIMARY KEY (projection, n))")
	require.NoError(t, err)
	count := func(name string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM seen WHERE projection = $1", name).Scan(&n))
		return n
	}

	for i, withFlush := range []bool{false, true} {
		name := map[bool]string{false: "queued", true: "queued_flushed"}[withFlush]
		var flushed atomic.Int64
		cfg := projection.Config{}
		if withFlush {
			cfg.FlushFunc = func(ctx context.Context, p projection.FlushParams) error {
				var n int64
				if err := p.Tx.QueryRow(ctx, "SELECT count(*) FROM seen WHERE projection = $1", p.Projection).Scan(&n); err != nil {
					return err
				}
				flushed.Store(n)
				return nil
			}
		}
		p, err := projection.New(name, cfg, projection.OnQueued("TicketWasRegistered",
			func(_ context.Context, q *projection.Queue, e projection.Event[registered]) error {
				q.Queue("INSERT INTO seen VALUES ($1, $2)", name, e.Data.N)
				return nil
			}))
		require.NoError(t, err)
		r := runner(t, b, p)
		if i == 0 {
			appendNumbers(t, store, 1, 1)
		}
		for count(name) == 0 { // the runner learns the position: later batches read ahead
			_, err := r.CatchUp(ctx, name)
			require.NoError(t, err)
		}
		if i == 0 {
			appendNumbers(t, store, 2, 4)
		}
		for count(name) < 4 {
			from := trips.len()
			_, err := r.CatchUp(ctx, name)
			require.NoError(t, err)
			var batch [][]string // the batch's round trips, without the notifier's and the test's
			for _, trip := range trips.since(from) {
				if !strings.Contains(trip[0], "pg_notify") && !strings.Contains(trip[0], "FROM seen") {
					batch = append(batch, trip)
				}
			}
			if withFlush {
				require.Greater(t, len(batch), 2, "the statements go before the flush hook")
				require.EqualValues(t, count(name), flushed.Load(), "the flush hook saw the rows")
				continue
			}
			require.Len(t, batch, 2, "two round trips")
			last := batch[len(batch)-1]
			if len(last) == 1 {
				continue // nothing readable yet: the batch only commits
			}
			n := len(last) - 2
			require.True(t, strings.HasPrefix(last[0], "INSERT INTO seen"), "the statements first")
			require.True(t, strings.HasPrefix(last[n], "UPDATE nudge_projections SET"), "then the advance")
			require.Equal(t, "commit", last[n+1])
		}
		require.Equal(t, 4, count(name), "every event once")
	}
}

// TestQueuedStatementThatCannotBePreparedFailsOnItsEvent: a queued statement that PostgreSQL
// cannot prepare (its table is missing) fails the whole round trip that commits the batch
// before any statement runs; the batch still fails on an event — the one that queued the first
// statement, as when the statements went in a round trip of their own — so the position stays
// before it and the status names it.
func TestQueuedStatementThatCannotBePreparedFailsOnItsEvent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(time.Minute))
	defer cancel()
	_, store, b := openBackend(t, nil)
	p, err := projection.New("missing", projection.Config{}, projection.OnQueued("TicketWasRegistered",
		func(_ context.Context, q *projection.Queue, e projection.Event[registered]) error {
			q.Queue("INSERT INTO no_such_table VALUES ($1)", e.Data.N)
			return nil
		}))
	require.NoError(t, err)
	r := runner(t, b, p)
	appendNumbers(t, store, 1, 3)

	var he *projection.HandlerError
	for he == nil { // the events may not be readable at once (see catchUpUntil)
		_, err := r.CatchUp(ctx, "missing")
		if err != nil {
			require.ErrorIs(t, err, projection.ErrHandler)
			require.ErrorAs(t, err, &he)
		}
		require.NoError(t, ctx.Err())
	}
	require.ErrorContains(t, he, "no_such_table")
	st, err := r.Status(ctx, "missing")
	require.NoError(t, err)
	require.Equal(t, projection.StateFailing, st.State)
	require.True(t, st.Position.IsZero(), "nothing committed")
	require.NotNil(t, st.FailingEvent)
	require.Equal(t, he.Event.Position, st.FailingEvent.Position, "the status names the event")
}
