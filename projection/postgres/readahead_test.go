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

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/postgres"
)

// readCounter counts the reads of the store's events sent as statements of their own (a
// pipelined batch's statements are not traced: the tracer is no pgx.BatchTracer).
type readCounter struct{ reads atomic.Int64 }

func (c *readCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	read := strings.HasPrefix(data.SQL, "SELECT global_position, transaction_id, event_id") || strings.Contains(data.SQL, "pick AS MATERIALIZED") // a read of some types
	if read && strings.Contains(data.SQL, "global_position) > (") {
		c.reads.Add(1)
	}
	return ctx
}

func (*readCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// tracedBackend is a store and backend on a new database whose pool counts the separate reads.
func tracedBackend(t *testing.T) (*espg.Store, *postgres.Backend, *readCounter) {
	t.Helper()
	counter := &readCounter{}
	_, store, b := openBackend(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = counter })
	return store, b, counter
}

// handledBy is a projection whose handler records the numbers it handled.
func handledBy(t *testing.T, name string) (*projection.Projection, func() []int) {
	t.Helper()
	var (
		mu   sync.Mutex
		seen []int
	)
	p, err := projection.New(name, projection.Config{}, projection.On("TicketWasRegistered",
		func(_ context.Context, _ pgx.Tx, e projection.Event[registered]) error {
			mu.Lock()
			seen = append(seen, e.Data.N)
			mu.Unlock()
			return nil
		}))
	require.NoError(t, err)
	return p, func() []int {
		mu.Lock()
		defer mu.Unlock()
		return append([]int(nil), seen...)
	}
}

func appendNumbers(t *testing.T, store *espg.Store, from, to int) {
	t.Helper()
	for n := from; n <= to; n++ {
		data, err := eventstore.NewEventData("TicketWasRegistered", registered{N: n, Label: "ok"})
		require.NoError(t, err)
		_, err = store.Append(context.Background(), "t-1", eventstore.Any, data)
		require.NoError(t, err)
	}
}

// catchUpUntil catches r's projection "tickets" up until seen holds n numbers: a catch-up can
// find an event not readable yet (a transaction that began before its append's, such as the
// store's notification after an earlier append, had not ended).
func catchUpUntil(ctx context.Context, t *testing.T, r *projection.Runner, n int, seen func() []int) {
	t.Helper()
	for len(seen()) < n {
		_, err := r.CatchUp(ctx, "tickets")
		require.NoError(t, err)
		require.NoError(t, ctx.Err(), "%d of %d events handled", len(seen()), n)
	}
}

// TestBatchReadsItsEventsInTheLockRoundTrip: once the runner has seen the projection's
// position, a batch reads its events in the round trip that takes its lock: no read of its own.
func TestBatchReadsItsEventsInTheLockRoundTrip(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(time.Minute))
	defer cancel()
	store, b, counter := tracedBackend(t)
	p, seen := handledBy(t, "tickets")
	r := runner(t, b, p)

	appendNumbers(t, store, 1, 3)
	catchUpUntil(ctx, t, r, 3, seen)
	require.Equal(t, []int{1, 2, 3}, seen())
	first := counter.reads.Load()
	require.Positive(t, first, "the first batch knows no position yet: it reads on its own")

	appendNumbers(t, store, 4, 5)
	catchUpUntil(ctx, t, r, 5, seen)
	require.Equal(t, []int{1, 2, 3, 4, 5}, seen())
	require.Equal(t, first, counter.reads.Load(), "the batches read their events with their locks")
}

// TestReadAheadFromAStalePositionReadsAgain: a runner whose last seen position is stale
// (another worker's runner moved the projection on since) reads after the position it finds
// under the lock: no event is handled twice or skipped.
func TestReadAheadFromAStalePositionReadsAgain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(time.Minute))
	defer cancel()
	store, b, counter := tracedBackend(t)
	pa, seenA := handledBy(t, "tickets")
	pb, seenB := handledBy(t, "tickets")
	ra, rb := runner(t, b, pa), runner(t, b, pb)

	appendNumbers(t, store, 1, 3)
	catchUpUntil(ctx, t, ra, 3, seenA)
	appendNumbers(t, store, 4, 5)
	catchUpUntil(ctx, t, rb, 2, seenB)
	require.Equal(t, []int{4, 5}, seenB())

	appendNumbers(t, store, 6, 6)
	before := counter.reads.Load()
	catchUpUntil(ctx, t, ra, 4, seenA)
	require.Equal(t, []int{1, 2, 3, 6}, seenA(), "A read after the position B committed, not after its own last one")
	require.Equal(t, before+1, counter.reads.Load(), "the read ahead after A's stale position was not used; the next batches' were")
}
