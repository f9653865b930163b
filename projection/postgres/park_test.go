package postgres_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/retry"
)

type ticketEvent struct {
	Ticket string `json:"ticket"`
	V      int    `json:"v"`
}

// orderLog records, per stream, the versions handled, in order (repeats included).
type orderLog struct {
	mu   sync.Mutex
	seen map[string][]int
}

func (l *orderLog) add(e projection.Event[ticketEvent]) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string][]int{}
	}
	l.seen[e.Data.Ticket] = append(l.seen[e.Data.Ticket], e.Data.V)
}

func (l *orderLog) of(stream string) []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.seen[stream])
}

// gate blocks a handler on one event until released, and signals when it got there.
type gate struct {
	stream  string
	v       int
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newGate(stream string, v int) *gate {
	return &gate{stream: stream, v: v, entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *gate) wait(e projection.Event[ticketEvent]) {
	if g == nil || e.Data.Ticket != g.stream || e.Data.V != g.v {
		return
	}
	g.once.Do(func() {
		close(g.entered)
		<-g.release
	})
}

func appendTicket(t testing.TB, s eventstore.Store, stream string, v int) {
	t.Helper()
	data, err := eventstore.NewEventData("T", ticketEvent{Ticket: stream, V: v})
	require.NoError(t, err)
	res, err := s.Append(context.Background(), stream, eventstore.Any, data)
	require.NoError(t, err)
	storetest.Settle(t, s, res.Last())
}

// waitForLockWaiter waits until a session of the test's database waits for an advisory lock:
// a batch or a redrive queued behind the projection's lock.
func waitForLockWaiter(t testing.TB, e env) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, e.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n))
		return n > 0
	}, testwait.For(10*time.Second), 5*time.Millisecond)
}

// parkedTicketProjection parks ticket "a" at version 1 (a permanent error while *broken) and
// logs every handled event; g, if set, blocks a handler.
func parkedTicketProjection(t testing.TB, log *orderLog, broken *bool, mu *sync.Mutex, g *gate) *projection.Projection {
	t.Helper()
	p, err := projection.New("tickets", projection.Config{OnFailure: projection.OnFailurePark},
		projection.OnIdempotent("T", func(_ context.Context, e projection.Event[ticketEvent]) error {
			mu.Lock()
			bad := *broken && e.Data.Ticket == "a" && e.Data.V == 1
			mu.Unlock()
			if bad {
				return retry.Permanent(errors.New("value too long"))
			}
			g.wait(e)
			log.add(e)
			return nil
		}))
	require.NoError(t, err)
	return p
}

// TestRedriveHoldsBackALiveBatch forces the interleaving: a redrive of the parked stream is in
// its handler (holding the projection's lock) when a new event of that stream arrives and a
// second worker's catch-up starts. The catch-up waits for the redrive's commit, then handles
// the new event: the stream's events are handled in version order, each once.
func TestRedriveHoldsBackALiveBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var (
		log    orderLog
		mu     sync.Mutex
		broken = true
	)
	g := newGate("a", 2)
	r1 := runner(t, e.backend, parkedTicketProjection(t, &log, &broken, &mu, g))
	r2 := runner(t, e.backend, parkedTicketProjection(t, &log, &broken, &mu, nil))
	appendTicket(t, e.store, "a", 1)
	appendTicket(t, e.store, "b", 1)
	appendTicket(t, e.store, "a", 2)
	_, err := r2.CatchUp(ctx, "tickets")
	require.NoError(t, err)
	require.Empty(t, log.of("a"))
	require.Equal(t, []int{1}, log.of("b"))

	mu.Lock()
	broken = false
	mu.Unlock()
	redrove := make(chan error, 1)
	go func() {
		_, err := r1.Redrive(ctx, "tickets", "a", "test")
		redrove <- err
	}()
	<-g.entered // the redrive holds the lock, in a's version 2
	appendTicket(t, e.store, "a", 3)
	caught := make(chan error, 1)
	go func() {
		_, err := r2.CatchUp(ctx, "tickets")
		caught <- err
	}()
	waitForLockWaiter(t, e) // the live catch-up waits for the lock
	require.Equal(t, []int{1}, log.of("a"), "the live batch handled nothing of a meanwhile")
	close(g.release)
	require.NoError(t, <-redrove)
	require.NoError(t, <-caught)
	require.Equal(t, []int{1, 2, 3}, log.of("a"), "in version order, each once")
	parked, err := e.backend.ParkedStreams(ctx, postgres.ParkedFilter{})
	require.NoError(t, err)
	require.Empty(t, parked)
}

// TestLiveBatchHoldsBackARedrive forces the other interleaving: a live batch is in a handler
// (holding the lock) with a new event of the parked stream in its batch when the redrive
// starts. The batch holds that event (counts it on the parked record); the redrive, once it
// has the lock, applies it after the earlier parked events.
func TestLiveBatchHoldsBackARedrive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var (
		log    orderLog
		mu     sync.Mutex
		broken = true
	)
	g := newGate("b", 2)
	live := runner(t, e.backend, parkedTicketProjection(t, &log, &broken, &mu, g))
	other := runner(t, e.backend, parkedTicketProjection(t, &log, &broken, &mu, nil))
	appendTicket(t, e.store, "a", 1)
	appendTicket(t, e.store, "a", 2)
	appendTicket(t, e.store, "b", 1)
	_, err := other.CatchUp(ctx, "tickets")
	require.NoError(t, err)
	mu.Lock()
	broken = false
	mu.Unlock()

	appendTicket(t, e.store, "b", 2)
	appendTicket(t, e.store, "a", 3)
	caught := make(chan error, 1)
	go func() {
		_, err := live.CatchUp(ctx, "tickets")
		caught <- err
	}()
	<-g.entered // the live batch holds the lock, in b's version 2
	redrove := make(chan error, 1)
	go func() {
		_, err := other.Redrive(ctx, "tickets", "a", "test")
		redrove <- err
	}()
	waitForLockWaiter(t, e)
	close(g.release)
	require.NoError(t, <-caught)
	require.NoError(t, <-redrove)
	require.Equal(t, []int{1, 2, 3}, log.of("a"), "in version order, each once")
	require.Equal(t, []int{1, 2}, log.of("b"))

	var (
		action, by string
		held       int64
	)
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT action, done_by, held_events FROM nudge_projection_park_actions`).Scan(&action, &by, &held))
	require.Equal(t, "redrive", action)
	require.Equal(t, "test", by)
	require.Equal(t, int64(2), held, "versions 2 and 3 were held, 3 by the live batch")

	// What the operator CLI shows for a stream no longer parked.
	actions, err := e.backend.ParkActions(ctx, postgres.ParkActionFilter{Projection: "tickets", StreamID: "a"})
	require.NoError(t, err)
	require.Len(t, actions, 1)
	require.Equal(t, projection.ParkActionRedrive, actions[0].Action)
	require.Equal(t, "test", actions[0].By)
	require.Equal(t, "a", actions[0].Stream.StreamID)
	require.Equal(t, int64(2), actions[0].Stream.Held)
	require.False(t, actions[0].At.IsZero())
	none, err := e.backend.ParkActions(ctx, postgres.ParkActionFilter{Projection: "tickets", StreamID: "b"})
	require.NoError(t, err)
	require.Empty(t, none)
}

// TestUnparkWithoutDefinition: the operator's skip and purge through the backend (the CLI's
// way, without the projection's definition) are refused without a reason, refused for a stream
// that is not parked, and recorded.
func TestUnparkWithoutDefinition(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var (
		log    orderLog
		mu     sync.Mutex
		broken = true
	)
	r := runner(t, e.backend, parkedTicketProjection(t, &log, &broken, &mu, nil))
	appendTicket(t, e.store, "a", 1)
	_, err := r.CatchUp(ctx, "tickets")
	require.NoError(t, err)
	st, err := e.backend.StatusOf(ctx, "tickets")
	require.NoError(t, err)
	require.Equal(t, 1, st.ParkedStreams)

	_, err = e.backend.Unpark(ctx, "tickets", "a", projection.ParkActionSkip, "ann", "")
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
	_, err = e.backend.Unpark(ctx, "tickets", "zz", projection.ParkActionSkip, "ann", "typo")
	require.ErrorIs(t, err, projection.ErrNotParked)
	done, err := e.backend.Unpark(ctx, "tickets", "a", projection.ParkActionSkip, "ann", "bad import")
	require.NoError(t, err)
	require.Len(t, done, 1)
	var action, reason string
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT action, reason FROM nudge_projection_park_actions`).Scan(&action, &reason))
	require.Equal(t, "skip", action)
	require.Equal(t, "bad import", reason)
	st, err = e.backend.StatusOf(ctx, "tickets")
	require.NoError(t, err)
	require.Zero(t, st.ParkedStreams)
}

// TestParkOnQueued: a statement an OnQueued handler queued fails when the batch sends it; the
// failure is charged to the event that queued it, so that event's stream parks and the others'
// rows commit, each once; after the fix the redrive applies the parked events in order.
func TestParkOnQueued(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	p, err := projection.New("queued", projection.Config{OnFailure: projection.OnFailurePark, ParkAfterAttempts: 1,
		InitFunc: func(ctx context.Context, hp projection.HookParams) error {
			_, err := hp.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS queued (ticket varchar(3) NOT NULL, v int NOT NULL, PRIMARY KEY (ticket, v))`)
			return err
		}},
		projection.OnQueued("T", func(_ context.Context, q *projection.Queue, ev projection.Event[ticketEvent]) error {
			q.Queue(`INSERT INTO queued VALUES ($1, $2)`, ev.Data.Ticket, ev.Data.V)
			return nil
		}))
	require.NoError(t, err)
	r := runner(t, e.backend, p)
	for v := 1; v <= 3; v++ {
		appendTicket(t, e.store, "ok", v)
		appendTicket(t, e.store, "long", v) // too long for varchar(3)
	}
	_, err = r.CatchUp(ctx, "queued")
	require.NoError(t, err)
	count := func(ticket string) int {
		var n int
		require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM queued WHERE ticket = $1`, ticket).Scan(&n))
		return n
	}
	require.Equal(t, 3, count("ok"))
	parked, err := r.Parked(ctx, "queued")
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, "long", parked[0].StreamID)
	require.Equal(t, int64(1), parked[0].StreamVersion)
	require.Equal(t, int64(2), parked[0].Held)

	_, err = e.db.Pool.Exec(ctx, `ALTER TABLE queued ALTER COLUMN ticket TYPE text`)
	require.NoError(t, err)
	n, err := r.Redrive(ctx, "queued", "long", "test")
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, 3, count("long"))
}
