package postgres_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	espg "github.com/nudgeworks/nudge/eventstore/postgres"
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

// TestBatchBeginsInItsLockRoundTrip: on a pool, a batch's BEGIN — and, for a projection that
// appends no events, the declaration that exempts it from the store's horizon — goes in the
// round trip that takes its lock: no round trip begins the transaction alone.
func TestBatchBeginsInItsLockRoundTrip(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(time.Minute))
	defer cancel()
	db := pgtest.New(t)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	trips := &roundTrips{}
	cfg.ConnConfig.Tracer = trips
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := espg.New(pool, espg.Config{})
	require.NoError(t, err)
	b, err := postgres.New(store)
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	require.NoError(t, b.Migrate(ctx))

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

		var locks [][]string
		for _, trip := range trips.since(from) {
			require.False(t, strings.HasPrefix(strings.ToLower(trip[0]), "begin") && len(trip) == 1,
				"a round trip of BEGIN alone (appends %v): %q", appends, trip)
			for i, sql := range trip {
				if strings.HasPrefix(sql, "SELECT pg_advisory_xact_lock(") && strings.Contains(sql, "hashtext(") {
					locks = append(locks, trip[:i+1])
				}
			}
		}
		require.NotEmpty(t, locks, "appends %v", appends)
		for _, lock := range locks {
			require.Equal(t, "begin isolation level read committed", strings.ToLower(lock[0]), "appends %v", appends)
			exempt := strings.Contains(lock[1], "pg_advisory_xact_lock_shared(")
			require.Equal(t, !appends, exempt, "the exemption is declared right after BEGIN unless the projection appends: %q", lock)
			require.Len(t, lock, map[bool]int{true: 3, false: 2}[exempt], "BEGIN, the exemption if any, then the lock: %q", lock)
		}
	}
}

// TestFailedLockRoundTripLeavesThePoolClean: a batch whose first round trip fails (its
// projection's status row is gone) fails with the typed error, and the connection it ran on
// goes back to the pool outside any transaction: the next batches run.
func TestFailedLockRoundTripLeavesThePoolClean(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(time.Minute))
	defer cancel()
	db := pgtest.New(t)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.MaxConns = 1 // every batch runs on the one connection
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := espg.New(pool, espg.Config{})
	require.NoError(t, err)
	b, err := postgres.New(store)
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	require.NoError(t, b.Migrate(ctx))
	p, seen := handledBy(t, "tickets")
	r := runner(t, b, p)
	appendNumbers(t, store, 1, 2)

	_, err = pool.Exec(ctx, "DELETE FROM nudge_projections WHERE name = 'tickets'")
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
