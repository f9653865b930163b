package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/projection/projectiontest"
)

type registered struct {
	N     int    `json:"n"`
	Label string `json:"label"`
}

func runner(t testing.TB, b projection.Backend, projections ...*projection.Projection) *projection.Runner {
	t.Helper()
	r, err := projection.NewRunner(b, projection.RunnerConfig{Logger: testlog.New(t)}, projections...)
	require.NoError(t, err)
	require.NoError(t, r.Init(context.Background()))
	return r
}

// TestBatchSemanticsWithSQLReadModel: batch size 500, the read model's column is too short for
// event 750. Events 1..749 are committed and visible, the position stops at 749, the status names
// event 750 and the database error. After the fix (widen the column) the next catch-up completes
// everything, each event applied once.
func TestBatchSemanticsWithSQLReadModel(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	var positions []eventstore.Position
	for start := 1; start <= 1000; start += 100 {
		var batch []eventstore.EventData
		for n := start; n < start+100; n++ {
			label := "ok"
			if n == 750 {
				label = strings.Repeat("x", 30)
			}
			data, err := eventstore.NewEventData("TicketWasRegistered", registered{N: n, Label: label})
			require.NoError(t, err)
			batch = append(batch, data)
		}
		res, err := e.store.Append(ctx, fmt.Sprintf("tickets-%d", start), eventstore.NoStream, batch...)
		require.NoError(t, err)
		for _, ev := range res.Events {
			positions = append(positions, ev.Position)
		}
	}
	storetest.Settle(t, e.store, positions[len(positions)-1])

	p, err := projection.New("ticket_list", projection.Config{
		BatchSize: 500,
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS ticket_list (n int PRIMARY KEY, label varchar(25) NOT NULL, times int NOT NULL)`)
			return err
		},
	}, projection.On("TicketWasRegistered", func(ctx context.Context, tx pgx.Tx, ev projection.Event[registered]) error {
		_, err := tx.Exec(ctx, `INSERT INTO ticket_list (n, label, times) VALUES ($1, $2, 1)
			ON CONFLICT (n) DO UPDATE SET times = ticket_list.times + 1`, ev.Data.N, ev.Data.Label)
		return err
	}))
	require.NoError(t, err)
	r := runner(t, e.backend, p)

	res, err := r.CatchUp(ctx, "ticket_list")
	require.ErrorIs(t, err, projection.ErrHandler)
	require.ErrorContains(t, err, "value too long")
	var he *projection.HandlerError
	require.ErrorAs(t, err, &he)
	require.Equal(t, positions[749], he.Event.Position)
	require.Equal(t, 749, res.Events)

	var count, maxN int
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*), max(n) FROM ticket_list`).Scan(&count, &maxN))
	require.Equal(t, 749, count, "events 1..749 are committed and visible")
	require.Equal(t, 749, maxN)

	// What an operator sees with plain SQL.
	var (
		state, lastError, failingType string
		globalPosition                int64
	)
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT state, global_position, last_error, failing_event_type
		FROM nudge_projections WHERE name = 'ticket_list'`).Scan(&state, &globalPosition, &lastError, &failingType))
	require.Equal(t, "failing", state)
	require.Equal(t, positions[748].GlobalPosition, globalPosition)
	require.Contains(t, lastError, "value too long")
	require.Equal(t, "TicketWasRegistered", failingType)
	st, err := r.Status(ctx, "ticket_list")
	require.NoError(t, err)
	require.Equal(t, he.Event.ID, st.FailingEvent.ID)
	require.Equal(t, positions[748], st.Position)

	_, err = e.db.Pool.Exec(ctx, `ALTER TABLE ticket_list ALTER COLUMN label TYPE varchar(100)`)
	require.NoError(t, err)
	res, err = r.CatchUp(ctx, "ticket_list")
	require.NoError(t, err)
	require.Equal(t, 251, res.Events)
	var wrong int
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE times <> 1) FROM ticket_list`).Scan(&count, &wrong))
	require.Equal(t, 1000, count)
	require.Zero(t, wrong, "every event applied exactly once")
	st, err = r.Status(ctx, "ticket_list")
	require.NoError(t, err)
	require.Equal(t, projection.StateRunning, st.State)
	require.Nil(t, st.FailingEvent)
	require.Empty(t, st.LastError, "the failure is cleared with the advance past it")
	require.Zero(t, st.Attempts)
	require.True(t, st.FirstFailureAt.IsZero() && st.LastFailureAt.IsZero())
}

// queryLog is a pgx tracer that keeps the SQL and arguments of every query.
type queryLog struct {
	mu      sync.Mutex
	queries []loggedQuery
}

type loggedQuery struct {
	sql  string
	args []any
	rows int64
}

type queryKey struct{}

func (l *queryLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, queryKey{}, loggedQuery{sql: data.SQL, args: data.Args})
}

func (l *queryLog) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	q, _ := ctx.Value(queryKey{}).(loggedQuery)
	q.rows = data.CommandTag.RowsAffected()
	l.mu.Lock()
	l.queries = append(l.queries, q)
	l.mu.Unlock()
}

// TraceBatchStart, TraceBatchQuery and TraceBatchEnd log the statements of pipelined batches
// too (a batch reads its events in the round trip that takes its lock).
func (l *queryLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (l *queryLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	l.mu.Lock()
	l.queries = append(l.queries, loggedQuery{sql: data.SQL, args: data.Args, rows: data.CommandTag.RowsAffected()})
	l.mu.Unlock()
}

func (l *queryLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestTypeFilterRunsInTheStore: a projection of 2 of 10 event types asks the store only for those
// types, and the store returns only their rows.
func TestTypeFilterRunsInTheStore(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	types := []string{"T0", "T1", "T2", "T3", "T4", "T5", "T6", "T7", "T8", "T9"}
	appended := projectiontest.AppendN(t, e.store, 0, 1000, types...)

	log := &queryLog{}
	cfg, err := pgxpool.ParseConfig(e.db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = log
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	store, err := espg.New(pool, espg.Config{})
	require.NoError(t, err)
	backend, err := postgres.New(store)
	require.NoError(t, err)
	// The catch-up's store sees its horizon past the last event: another database's
	// transaction ending meanwhile (its commit window) cannot hold the catch-up back then.
	storetest.Settle(t, store, appended[len(appended)-1])

	handled := 0
	handler := func(context.Context, projection.Event[projectiontest.Payload]) error { handled++; return nil }
	p, err := projection.New("two-types", projection.Config{BatchSize: 50},
		projection.OnIdempotent("T3", handler), projection.OnIdempotent("T7", handler))
	require.NoError(t, err)
	r := runner(t, backend, p)
	res, err := r.CatchUp(ctx, "two-types")
	require.NoError(t, err)
	require.Equal(t, 200, res.Events)
	require.Equal(t, 200, handled)

	var reads, rows int64
	for _, q := range log.queries {
		if !strings.Contains(q.sql, "FROM nudge_events") || !strings.Contains(q.sql, "LIMIT $3") {
			continue
		}
		reads++
		rows += q.rows
		require.Len(t, q.args, 5, "every read carries the type filter (and the store's floor)")
		require.Equal(t, []string{"T3", "T7"}, q.args[3])
		require.Equal(t, 50, q.args[2], "the batch size is the read limit")
	}
	require.Equal(t, int64(5), reads, "4 full batches and the empty read that ends the catch-up")
	require.Equal(t, int64(200), rows, "the store returned only rows of the two types")
}

// TestRebuildIsIdentical: Reset and catch-up build the same read model as the first build.
func TestRebuildIsIdentical(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	projectiontest.AppendN(t, e.store, 0, 3000, "A", "B")
	p, err := projection.New("per-stream", projection.Config{
		BatchSize: 256,
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS per_stream (stream_id text PRIMARY KEY, events int NOT NULL, sum bigint NOT NULL, last_version bigint NOT NULL)`)
			return err
		},
		ResetFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `TRUNCATE per_stream`)
			return err
		},
	}, projection.On("A", upsertPerStream), projection.On("B", upsertPerStream))
	require.NoError(t, err)
	r := runner(t, e.backend, p)
	_, err = r.CatchUp(ctx, "per-stream")
	require.NoError(t, err)
	first := dumpTable(t, e.db.Pool, `SELECT stream_id, events, sum, last_version FROM per_stream ORDER BY stream_id`)
	require.Len(t, first, 7)

	require.NoError(t, r.Reset(ctx, "per-stream"))
	require.Empty(t, dumpTable(t, e.db.Pool, `SELECT stream_id FROM per_stream`), "the reset hook ran in the reset transaction")
	st, err := r.Status(ctx, "per-stream")
	require.NoError(t, err)
	require.Equal(t, projection.StateRebuilding, st.State)
	done, total := st.Progress()
	require.Equal(t, int64(0), done)
	require.Equal(t, int64(3000), total)

	res, err := r.CatchUp(ctx, "per-stream")
	require.NoError(t, err)
	require.Equal(t, 3000, res.Events)
	require.Equal(t, first, dumpTable(t, e.db.Pool, `SELECT stream_id, events, sum, last_version FROM per_stream ORDER BY stream_id`))
	st, err = r.Status(ctx, "per-stream")
	require.NoError(t, err)
	require.Equal(t, projection.StateRunning, st.State)
	require.Equal(t, int64(3000), st.EventsProcessed)
}

func upsertPerStream(ctx context.Context, tx pgx.Tx, e projection.Event[projectiontest.Payload]) error {
	_, err := tx.Exec(ctx, `INSERT INTO per_stream (stream_id, events, sum, last_version) VALUES ($1, 1, $2, $3)
		ON CONFLICT (stream_id) DO UPDATE SET events = per_stream.events + 1, sum = per_stream.sum + $2, last_version = $3`,
		e.StreamID, e.Data.N, e.StreamVersion)
	return err
}

func dumpTable(t testing.TB, pool *pgxpool.Pool, query string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), query)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		values, err := rows.Values()
		require.NoError(t, err)
		out = append(out, fmt.Sprint(values...))
	}
	require.NoError(t, rows.Err())
	return out
}

// TestStatusShowsHorizonWait: a writing transaction left open holds the projection back; the
// status says it waits on that transaction, not on work, and it catches up once it ends.
func TestStatusShowsHorizonWait(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	projectiontest.AppendN(t, e.store, 0, 5, "A")
	rec := projectiontest.NewRecorder()
	r := runner(t, e.backend, mustNew(t, "waiting", projection.OnIdempotent("A", rec.Handle)))
	_, err := r.CatchUp(ctx, "waiting")
	require.NoError(t, err)

	open, err := e.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = open.Rollback(ctx) }()
	_, err = open.Exec(ctx, `CREATE TEMP TABLE holding (x int); INSERT INTO holding VALUES (1)`)
	require.NoError(t, err, "an unrelated writing transaction")
	var xid uint64
	require.NoError(t, open.QueryRow(ctx, `SELECT pg_current_xact_id()`).Scan(&xid))
	late, err := e.store.Append(ctx, "late", eventstore.Any, storetest.Event("A", 5))
	require.NoError(t, err)

	// Other tests' transactions on the server may be older and hold the horizon first for a
	// while; this one stays open until the status names it.
	var st projection.Status
	require.Eventually(t, func() bool {
		st, err = r.Status(ctx, "waiting")
		require.NoError(t, err)
		return st.Holder != nil && st.Holder.TransactionID == xid
	}, testwait.For(2*time.Minute), 5*time.Millisecond, "the status names the transaction it waits on")
	require.True(t, st.HeldByHorizon, "committed events wait behind the open transaction")
	require.Zero(t, st.LagEvents, "nothing is readable yet")
	require.Positive(t, st.Holder.Age)
	res, err := r.CatchUp(ctx, "waiting")
	require.NoError(t, err)
	require.Zero(t, res.Events, "the projection waits; it does not skip")

	require.NoError(t, open.Rollback(ctx))
	storetest.Settle(t, e.store, late.Last())
	res, err = r.CatchUp(ctx, "waiting")
	require.NoError(t, err)
	require.Equal(t, 1, res.Events)
	st, err = r.Status(ctx, "waiting")
	require.NoError(t, err)
	require.False(t, st.HeldByHorizon)
}

func mustNew(t testing.TB, name string, handlers ...projection.Handler) *projection.Projection {
	t.Helper()
	p, err := projection.New(name, projection.Config{}, handlers...)
	require.NoError(t, err)
	return p
}

// TestInline: the read model is written in the append's transaction; a handler error rolls the
// append back.
func TestInline(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	_, err := e.db.Pool.Exec(ctx, `CREATE TABLE inline_tickets (n int PRIMARY KEY)`)
	require.NoError(t, err)
	p := mustNew(t, "inline-tickets", projection.On("A", func(ctx context.Context, tx pgx.Tx, ev projection.Event[projectiontest.Payload]) error {
		if ev.Data.N < 0 {
			return errors.New("negative ticket numbers are not allowed")
		}
		_, err := tx.Exec(ctx, `INSERT INTO inline_tickets VALUES ($1)`, ev.Data.N)
		return err
	}))
	in, err := postgres.NewInline(e.store, p)
	require.NoError(t, err)

	_, err = in.Append(ctx, "s", eventstore.NoStream, storetest.Event("A", 1), storetest.Event("A", 2))
	require.NoError(t, err)
	require.Equal(t, []string{"1", "2"}, dumpTable(t, e.db.Pool, `SELECT n FROM inline_tickets ORDER BY n`))

	// A handler error fails the append: neither the events nor the rows are written.
	err = pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
		_, err := in.AppendTx(ctx, tx, "s", eventstore.Exact(2), storetest.Event("A", 3), storetest.Event("A", -1))
		return err
	})
	require.ErrorIs(t, err, projection.ErrHandler)
	require.ErrorContains(t, err, "negative ticket numbers")
	events, err := e.store.ReadStream(ctx, "s", 0, 0)
	require.NoError(t, err)
	require.Len(t, events, 2)
	require.Equal(t, []string{"1", "2"}, dumpTable(t, e.db.Pool, `SELECT n FROM inline_tickets ORDER BY n`))

	// An idempotent repeat of an append is not applied again.
	withID := storetest.Event("A", 10)
	withID.ID = uuid.New()
	_, err = in.Append(ctx, "t", eventstore.NoStream, withID)
	require.NoError(t, err)
	repeat, err := in.Append(ctx, "t", eventstore.NoStream, withID)
	require.NoError(t, err, "a repeat would violate the read model's primary key if applied")
	require.True(t, repeat.Idempotent)

	_, err = postgres.NewInline(nil, p)
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
	_, err = postgres.NewInline(e.store, p, p)
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
}

// TestInlineRefusesPartitions: an inline projection runs in the append's transaction as one
// unit; a partitioned one is refused with a config error that names it and says what to do.
func TestInlineRefusesPartitions(t *testing.T) {
	t.Parallel()
	store := newEnv(t).store
	ok := func(context.Context, pgx.Tx, projection.Event[projectiontest.Payload]) error { return nil }
	split, err := projection.New("split-tickets", projection.Config{Partitions: 4}, projection.On("A", ok))
	require.NoError(t, err)
	_, err = postgres.NewInline(store, mustNew(t, "whole-tickets", projection.On("A", ok)), split)
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
	require.ErrorContains(t, err, "inline projection split-tickets has Partitions 4")
	require.ErrorContains(t, err, "leave Partitions at 1, or run the projection through a Runner")

	one, err := projection.New("one-tickets", projection.Config{Partitions: 1}, projection.On("A", ok))
	require.NoError(t, err)
	_, err = postgres.NewInline(store, one)
	require.NoError(t, err, "Partitions 1 is one unit")
}

// TestPoller: the poller catches new events up without any broker and, while idle, waits longer
// and longer.
func TestPoller(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rec := projectiontest.NewRecorder()
	r := runner(t, e.backend, mustNew(t, "polled", projection.OnIdempotent("A", rec.Handle)))

	var (
		mu    sync.Mutex
		polls []projection.PollParams
	)
	poller, err := projection.NewPoller(r, projection.PollerConfig{
		MinInterval: 5 * time.Millisecond,
		MaxInterval: 80 * time.Millisecond,
		AfterPollFunc: func(p projection.PollParams) {
			mu.Lock()
			polls = append(polls, p)
			mu.Unlock()
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- poller.Run(ctx) }()

	projectiontest.AppendN(t, e.store, 0, 300, "A")
	require.Eventually(t, func() bool { return rec.Distinct() == 300 }, testwait.For(time.Minute), 5*time.Millisecond)
	projectiontest.AppendN(t, e.store, 300, 10, "A")
	require.Eventually(t, func() bool { return rec.Distinct() == 310 }, testwait.For(time.Minute), 5*time.Millisecond)

	// Idle polls: the wait grows to the cap.
	mark := func() int { mu.Lock(); defer mu.Unlock(); return len(polls) }()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(polls) >= mark+6
	}, testwait.For(time.Minute), 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done, "Run returns when its context ends")

	mu.Lock()
	defer mu.Unlock()
	var idle []time.Duration
	for _, p := range polls[mark:] {
		require.NoError(t, p.Err)
		if p.Result.Events == 0 {
			idle = append(idle, p.Next)
		}
	}
	require.GreaterOrEqual(t, len(idle), 5)
	require.True(t, slices.IsSorted(idle), "idle waits never shrink: %v", idle)
	require.Equal(t, 80*time.Millisecond, idle[len(idle)-1], "idle waits reach the cap: %v", idle)
	require.Equal(t, 310, rec.Calls(), "each event handled once")
}

// TestPollerStretchesTheWaitWhenBusy: with MaxBusyInterval, the wait after a catch-up grows
// with the events it handled, up to MaxBusyInterval for a full batch or more.
func TestPollerStretchesTheWaitWhenBusy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rec := projectiontest.NewRecorder()
	p, err := projection.New("busy", projection.Config{BatchSize: 100}, projection.OnIdempotent("A", rec.Handle))
	require.NoError(t, err)
	r := runner(t, e.backend, p)
	waits := make(chan projection.PollParams, 100)
	poller, err := projection.NewPoller(r, projection.PollerConfig{
		MinInterval: 10 * time.Millisecond, MaxInterval: 20 * time.Millisecond, MaxBusyInterval: 110 * time.Millisecond,
		AfterPollFunc: func(p projection.PollParams) {
			if p.Result.Events > 0 {
				waits <- p
			}
		},
	})
	require.NoError(t, err)
	projectiontest.AppendN(t, e.store, 0, 250, "A")
	runPoller(t, poller)

	next := func() projection.PollParams { t.Helper(); return nextPoll(t, waits) }
	first := next()
	require.Equal(t, 250, first.Result.Events, "the start-up catch-up handles everything")
	require.Equal(t, 110*time.Millisecond, first.Next, "more than a batch: the longest wait")
	projectiontest.AppendN(t, e.store, 250, 30, "A")
	second := next()
	require.Equal(t, 30, second.Result.Events)
	require.Equal(t, 40*time.Millisecond, second.Next, "30 of 100: 10 ms and 30 percent of the 100 ms stretch")

	_, err = projection.NewPoller(r, projection.PollerConfig{MinInterval: time.Second, MaxBusyInterval: time.Millisecond})
	require.ErrorIs(t, err, projection.ErrInvalidConfig)
}

// TestSmallPoolDoesNotDeadlock: as many projections catching up at once as the pool has
// connections, with crash-loop tracking on. Each batch holds a connection and its tracking wants
// another; the tracking gives up in time instead of waiting for ever.
func TestSmallPoolDoesNotDeadlock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	projectiontest.AppendN(t, e.store, 0, 200, "A")
	pool := e.db.NewPool(t, 2)
	store, err := espg.New(pool, espg.Config{})
	require.NoError(t, err)
	backend, err := postgres.New(store)
	require.NoError(t, err)
	var ps []*projection.Projection
	recs := map[string]*projectiontest.Recorder{}
	for i := range 2 {
		name := fmt.Sprintf("p%d", i)
		recs[name] = projectiontest.NewRecorder()
		p, err := projection.New(name, projection.Config{BatchSize: 100, CrashLoopLimit: projection.CrashLoopLimitSuggested},
			projection.OnIdempotent("A", recs[name].Handle))
		require.NoError(t, err)
		ps = append(ps, p)
	}
	r := runner(t, backend, ps...)
	ctx := testwait.Context(t, 2*time.Minute)
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := r.CatchUp(ctx, p.Name())
			require.NoError(t, err)
		}()
	}
	wg.Wait()
	for name, rec := range recs {
		require.Equal(t, 200, rec.Distinct(), name)
	}
}

// TestSlowBatchDoesNotHoldOtherProjections: a batch that wrote its read model and then stalls
// (its transaction open) does not hold back another projection's reads, because batches are
// exempt from the store's horizon; an append inside such a batch is refused. A projection
// declared with AppendsEvents may append in its batch, and then holds the other back like any
// writing transaction.
func TestSlowBatchDoesNotHoldOtherProjections(t *testing.T) {
	t.Parallel()
	for _, appends := range []bool{false, true} {
		t.Run(fmt.Sprintf("AppendsEvents=%v", appends), func(t *testing.T) {
			t.Parallel()
			if !appends {
				pgtest.HoldHorizonTurn(t) // it waits for the horizon with the slow batch open
			}
			e := newEnv(t)
			ctx := context.Background()
			_, err := e.db.Pool.Exec(ctx, `CREATE TABLE slow_model (id uuid PRIMARY KEY)`)
			require.NoError(t, err)
			projectiontest.AppendN(t, e.store, 0, 1, "A") // and waits until it is readable

			wrote, release := make(chan error, 1), make(chan struct{})
			slow, err := projection.New("slow", projection.Config{AppendsEvents: appends},
				projection.On("A", func(ctx context.Context, tx pgx.Tx, ev projection.Event[projectiontest.Payload]) error {
					if _, err := tx.Exec(ctx, `INSERT INTO slow_model VALUES ($1)`, ev.ID); err != nil {
						return err
					}
					_, err := e.store.AppendTx(ctx, tx, "by-slow", eventstore.Any, storetest.Event("B", 1))
					wrote <- err
					<-release
					return nil
				}))
			require.NoError(t, err)
			rec := projectiontest.NewRecorder()
			r := runner(t, e.backend, slow, mustNew(t, "fast", projection.OnIdempotent("A", rec.Handle)))

			slowDone := make(chan error, 1)
			go func() {
				_, err := r.CatchUp(ctx, "slow")
				slowDone <- err
			}()
			appendErr := <-wrote
			defer func() {
				close(release)
				require.NoError(t, <-slowDone)
			}()

			second, err := e.store.Append(ctx, "second", eventstore.Any, storetest.Event("A", 1))
			require.NoError(t, err)
			wantEvents, wantHeld := 1, true // the event after the appending batch began waits for it
			if appends {
				require.NoError(t, appendErr, "a batch of a projection that appends events may append")
			} else {
				require.ErrorIs(t, appendErr, espg.ErrExempt, "an exempt batch cannot append")
				// Other tests' transactions on the server may hold the horizon for moments;
				// the slow batch stays open throughout.
				storetest.Settle(t, e.store, second.Last())
				wantEvents, wantHeld = 2, false // the stalled batch does not hold the other projection back
			}
			res, err := r.CatchUp(ctx, "fast")
			require.NoError(t, err)
			require.Equal(t, wantEvents, res.Events)
			st, err := r.Status(ctx, "fast")
			require.NoError(t, err)
			require.Equal(t, wantHeld, st.HeldByHorizon)
		})
	}
}

// TestPollerCountsWhatTheCatchUpWaited: the wait after a catch-up that handled events is
// shortened by what WaitedFunc says the catch-up already waited, to no less than zero; the
// idle wait is not.
func TestPollerCountsWhatTheCatchUpWaited(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rec := projectiontest.NewRecorder()
	r := runner(t, e.backend, mustNew(t, "waited", projection.OnIdempotent("A", rec.Handle)))
	var waited, shortIdle atomic.Int64
	waited.Store(int64(30 * time.Millisecond))
	busy := make(chan projection.PollParams, 100)
	poller, err := projection.NewPoller(r, projection.PollerConfig{
		MinInterval: 100 * time.Millisecond, MaxInterval: 200 * time.Millisecond,
		WaitedFunc: func(name string) time.Duration {
			if name != "waited" {
				return time.Hour // fails the checks below
			}
			return time.Duration(waited.Load())
		},
		AfterPollFunc: func(p projection.PollParams) {
			switch {
			case p.Err != nil:
			case p.Result.Events > 0:
				busy <- p
			case p.Next < 200*time.Millisecond:
				shortIdle.Add(1)
			}
		},
	})
	require.NoError(t, err)
	runPoller(t, poller)
	projectiontest.AppendN(t, e.store, 0, 5, "A")
	require.Equal(t, 70*time.Millisecond, nextPoll(t, busy).Next, "100 ms less the 30 ms the catch-up waited")
	waited.Store(int64(time.Second))
	projectiontest.AppendN(t, e.store, 5, 5, "A")
	require.Zero(t, nextPoll(t, busy).Next, "a catch-up that waited longer than the wait polls again at once")
	require.Zero(t, shortIdle.Load(), "idle waits are not shortened")
}

// runPoller runs poller until the test ends, and checks that Run returns nil then.
func runPoller(t *testing.T, poller *projection.Poller) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- poller.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}
