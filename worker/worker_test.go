package worker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/nudgeworks/nudge/channel"
	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	"github.com/nudgeworks/nudge/channel/gochannel"
	pgchannel "github.com/nudgeworks/nudge/channel/postgres"
	"github.com/nudgeworks/nudge/deadletter"
	dlmemory "github.com/nudgeworks/nudge/deadletter/memory"
	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/eventstore/storetest"
	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/projection"
	pgproj "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/projection/projectiontest"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/trigger"
	"github.com/nudgeworks/nudge/worker"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pgx pools and watermill's GoChannel close asynchronously after the tests that own them.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
	)
}

// eventually is how long a test waits for what it expects before it fails: an upper bound for
// a failure on a busy machine, never the expected time. The horizon is cluster-wide, so a
// transaction held open by any test on the server delays every projection.
var eventually = testwait.For(2 * time.Minute)

// channelCase is a backend the worker tests run on, and how appends publish its triggers.
type channelCase struct {
	new func(t testing.TB, s *setup) channel.Channel
	// inTx: triggers are published in the append's transaction (relay.Appender); otherwise a
	// relay.Relay publishes them.
	inTx bool
}

var channels = map[string]channelCase{
	"gochannel": {new: func(t testing.TB, _ *setup) channel.Channel { return goChannel(t) }},
	"amqp": {new: func(t testing.TB, s *setup) channel.Channel {
		env := amqptest.New(t)
		s.amqp = env
		ch, err := amqpchannel.New(context.Background(), amqpchannel.Config{URL: env.URL, Prefix: env.Prefix, ConnectionName: env.ConnectionName, Logger: s.logger})
		require.NoError(t, err)
		return ch
	}},
	"postgres": {inTx: true, new: func(t testing.TB, s *setup) channel.Channel {
		ch, err := pgchannel.New(s.db.NewPool(t, 24), pgchannel.Config{PollInterval: 10 * time.Millisecond, Logger: s.logger})
		require.NoError(t, err)
		return ch
	}},
}

// setup is a PostgreSQL store and projection backend on a database of the test's own.
type setup struct {
	db       *pgtest.DB
	store    *espg.Store
	backend  *pgproj.Backend
	logger   *slog.Logger
	appender *relay.Appender    // set when triggers are published in the append's transaction
	amqp     *amqptest.Env      // set on the RabbitMQ channel
	runner   *projection.Runner // the runner of the worker started last
	dead     *dlmemory.Store    // the dead letters of workers started without a store of their own
	// ownRouter makes start run the handlers on a router of the test's own, wired the way the
	// README shows (Prepare, AddHandlers, RunBackground), instead of Worker.Run.
	ownRouter bool
}

// newChannel returns the case's channel for s; with an in-transaction channel, s.append
// publishes through it from then on.
func (s *setup) newChannel(t testing.TB, cc channelCase) channel.Channel {
	t.Helper()
	ch := cc.new(t, s)
	if cc.inTx {
		pub, ok := ch.(relay.TxPublisher)
		require.True(t, ok, "an in-transaction channel implements relay.TxPublisher")
		require.NoError(t, ch.Declare(context.Background())) // the tables, before any append
		var err error
		s.appender, err = relay.NewAppender(s.store, pub)
		require.NoError(t, err)
	}
	return ch
}

// append appends and publishes the trigger the way the channel does.
func (s *setup) append(t testing.TB, stream string, events ...eventstore.EventData) {
	t.Helper()
	var err error
	if s.appender != nil {
		_, err = s.appender.Append(context.Background(), stream, eventstore.Any, events...)
	} else {
		_, err = s.store.Append(context.Background(), stream, eventstore.Any, events...)
	}
	if err != nil {
		t.Errorf("append to %s: %v", stream, err)
	}
}

func newSetup(t testing.TB) *setup {
	t.Helper()
	db := pgtest.New(t)
	db.Pool = db.NewPool(t, 16) // room for eight writers in the benchmarks
	store, err := espg.New(db.Pool, espg.Config{})
	require.NoError(t, err)
	backend, err := pgproj.New(store)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, store.Migrate(ctx))
	require.NoError(t, backend.Migrate(ctx))
	return &setup{db: db, store: store, backend: backend, logger: testlog.New(t), dead: dlmemory.New(dlmemory.Config{})}
}

// model is a projection that records every event in a table of its own, once.
func (s *setup) model(t testing.TB, name string, fail func(n int) error) *projection.Projection {
	t.Helper()
	table := pgx.Identifier{name + "_model"}.Sanitize()
	p, err := projection.New(name, projection.Config{
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (n int PRIMARY KEY, times int NOT NULL)`)
			return err
		},
	}, projection.On("A", func(ctx context.Context, tx pgx.Tx, e projection.Event[projectiontest.Payload]) error {
		if fail != nil {
			if err := fail(e.Data.N); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, 1) ON CONFLICT (n) DO UPDATE SET times = `+table+`.times + 1`, e.Data.N)
		return err
	}))
	require.NoError(t, err)
	return p
}

func (s *setup) count(t testing.TB, name string) (rows, wrong int) {
	t.Helper()
	table := pgx.Identifier{name + "_model"}.Sanitize()
	require.NoError(t, s.db.Pool.QueryRow(context.Background(),
		`SELECT count(*), count(*) FILTER (WHERE times <> 1) FROM `+table).Scan(&rows, &wrong))
	return rows, wrong
}

func (s *setup) has(t testing.TB, name string, n int) bool {
	t.Helper()
	var ok bool
	require.NoError(t, s.db.Pool.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT 1 FROM `+pgx.Identifier{name + "_model"}.Sanitize()+` WHERE n = $1)`, n).Scan(&ok))
	return ok
}

// eachChannel runs test as a parallel subtest on every channel, with a fresh setup.
func eachChannel(t *testing.T, test func(t *testing.T, s *setup, ch channel.Channel)) {
	for name, cc := range channels {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t)
			test(t, s, s.newChannel(t, cc))
		})
	}
}

// start runs a worker, and a relay publishing to ch unless appends publish in their
// transaction, until the test ends; then it closes ch.
func (s *setup) start(t testing.TB, ch channel.Channel, cfg worker.Config, projections ...*projection.Projection) *worker.Worker {
	t.Helper()
	w, stop := s.startStoppable(t, ch, cfg, projections...)
	t.Cleanup(func() {
		stop()
		require.NoError(t, ch.Close())
	})
	return w
}

// startStoppable is start without the cleanup: stop ends the worker and the relay (not ch).
func (s *setup) startStoppable(t testing.TB, ch channel.Channel, cfg worker.Config, projections ...*projection.Projection) (*worker.Worker, func()) {
	t.Helper()
	runner, err := projection.NewRunner(s.backend, projection.RunnerConfig{Logger: s.logger}, projections...)
	require.NoError(t, err)
	require.NoError(t, runner.Init(context.Background()))
	s.runner = runner
	cfg.Runner, cfg.Channel, cfg.Logger, cfg.Store = runner, ch, s.logger, s.store
	if cfg.DeadLetters == nil {
		cfg.DeadLetters = s.dead
	}
	w, err := worker.New(cfg)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if s.ownRouter {
		s.runOwnRouter(ctx, t, &wg, w)
	} else {
		wg.Go(func() { require.NoError(t, w.Run(ctx)) })
	}
	if s.appender == nil {
		rel, err := relay.New(s.backend, ch, relay.Config{Logger: s.logger})
		require.NoError(t, err)
		wg.Add(1)
		go func() { defer wg.Done(); require.NoError(t, rel.Run(ctx)) }()
	}
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	select {
	case <-w.Running():
	case <-time.After(eventually):
		t.Fatalf("the worker did not start within %s", eventually)
	}
	return w, stop
}

// goChannel returns a new GoChannel channel.
func goChannel(t testing.TB) *gochannel.Channel {
	t.Helper()
	ch, err := gochannel.New(gochannel.Config{})
	require.NoError(t, err)
	return ch
}

// runOwnRouter runs w's handlers on a router of the test's own until ctx ends, the way a
// service that owns its router wires them.
func (s *setup) runOwnRouter(ctx context.Context, t testing.TB, wg *sync.WaitGroup, w *worker.Worker) {
	t.Helper()
	require.NoError(t, w.Prepare(ctx))
	router, err := message.NewRouter(message.RouterConfig{}, worker.RouterLogger(watermill.NewSlogLogger(s.logger)))
	require.NoError(t, err)
	require.NoError(t, w.AddHandlers(router))
	wg.Go(func() { require.NoError(t, router.Run(ctx)) })
	wg.Go(func() { require.NoError(t, w.RunBackground(ctx)) })
}

// awaitDeadLetters waits until s.dead holds n records and returns them.
func (s *setup) awaitDeadLetters(t testing.TB, n int) []deadletter.Record {
	t.Helper()
	var recs []deadletter.Record
	require.Eventually(t, func() bool {
		var err error
		recs, err = s.dead.List(context.Background(), deadletter.Filter{})
		require.NoError(t, err)
		return len(recs) >= n
	}, eventually, 5*time.Millisecond, "waiting for %d dead letters", n)
	return recs
}

// TestEndToEnd: append → relay → trigger → catch-up → read model, two projections at once, on
// every channel; each event applied once.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	eachChannel(t, func(t *testing.T, s *setup, ch channel.Channel) {
		w := s.start(t, ch, worker.Config{SafetyNetInterval: -1}, s.model(t, "alpha", nil), s.model(t, "beta", nil))

		// Appends after the worker runs, from several writers, reach both read models
		// through triggers alone (the safety net is off).
		var wg sync.WaitGroup
		for writer := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 50 {
					s.append(t, fmt.Sprintf("s-%d", writer), storeEvent(writer*1000+i))
				}
			}()
		}
		wg.Wait()
		for _, p := range []string{"alpha", "beta"} {
			require.Eventually(t, func() bool { rows, _ := s.count(t, p); return rows == 200 }, eventually, 10*time.Millisecond, p)
			_, wrong := s.count(t, p)
			require.Zero(t, wrong, "%s applied an event twice", p)
			st := w.Stats(p)
			require.Positive(t, st.Received)
			require.Positive(t, st.CatchUps)
			require.LessOrEqual(t, st.CatchUps, st.Received+1, "one catch-up at start, then at most one per trigger")
		}
	})
}

func storeEvent(n int) eventstore.EventData {
	data, err := eventstore.NewEventData("A", projectiontest.Payload{N: n})
	if err != nil {
		panic(err)
	}
	return data
}

// TestIsolation: projection A fails on every event and its retry waits an hour; meanwhile B
// projects every event appended after A failed. Had A's failures held B back (a shared
// subscription, handler or lock), B would wait for that hour and the test would fail at its
// deadline.
func TestIsolation(t *testing.T) {
	t.Parallel()
	eachChannel(t, func(t *testing.T, s *setup, ch channel.Channel) {
		broken := errors.New("A is broken")
		w := s.start(t, ch, worker.Config{SafetyNetInterval: -1, Retry: retry.Policy{MaxAttempts: 4, InitialInterval: time.Hour, MaxInterval: time.Hour, MaxElapsedTime: -1}},
			s.model(t, "failing-a", func(int) error { return broken }), s.model(t, "healthy-b", nil))

		s.append(t, "s", storeEvent(0))
		require.Eventually(t, func() bool { return w.Stats("failing-a").Failures > 0 }, eventually, 10*time.Millisecond,
			"A fails, then waits to retry")

		for n := 1; n <= 10; n++ {
			s.append(t, "s", storeEvent(n))
		}
		require.Eventually(t, func() bool { rows, _ := s.count(t, "healthy-b"); return rows == 11 }, eventually, 5*time.Millisecond,
			"B projects every event while A waits an hour to retry")
		rows, _ := s.count(t, "failing-a")
		require.Zero(t, rows)
	})
}

// droppingChannel loses every trigger published through Publish.
type droppingChannel struct {
	channel.Channel
	dropped atomic.Int64
}

func (d *droppingChannel) Publish(context.Context, trigger.Trigger) error {
	d.dropped.Add(1)
	return nil
}

// TestLostTriggers: with every trigger lost, the start-up catch-up and the safety-net tick
// still bring the read model up to date.
func TestLostTriggers(t *testing.T) {
	t.Parallel()
	for name, cc := range channels {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t)
			for n := range 20 {
				_, err := s.store.Append(context.Background(), "before", eventstore.Any, storeEvent(n))
				require.NoError(t, err)
			}
			ch := &droppingChannel{Channel: s.newChannel(t, cc)}
			// StallAfter 1 ms: any event the safety net finds waiting is a stall.
			w := s.start(t, ch, worker.Config{SafetyNetInterval: 200 * time.Millisecond, StallAfter: time.Millisecond}, s.model(t, "alpha", nil))
			require.Eventually(t, func() bool { rows, _ := s.count(t, "alpha"); return rows == 20 }, eventually, 10*time.Millisecond,
				"the start-up catch-up handles what was appended before the worker ran")

			for n := 20; n < 40; n++ {
				_, err := s.store.Append(context.Background(), "after", eventstore.Any, storeEvent(n))
				require.NoError(t, err)
			}
			require.Eventually(t, func() bool { rows, _ := s.count(t, "alpha"); return rows == 40 }, eventually, 10*time.Millisecond,
				"the safety net handles appends whose triggers were lost")
			if s.appender == nil {
				require.Positive(t, ch.dropped.Load(), "the relay's triggers were dropped")
			} // else the appends above published no trigger at all

			// The safety net counts the stall: events waited and no trigger started a catch-up.
			// (An event appended while a safety-net catch-up runs may be caught by it, before
			// any tick sees it waiting: append until a tick does.)
			for n := 40; w.Stats("alpha").Stalls == 0; n++ {
				require.Less(t, n, 200, "no stall was counted")
				_, err := s.store.Append(context.Background(), "after", eventstore.Any, storeEvent(n))
				require.NoError(t, err)
				require.Eventually(t, func() bool { rows, _ := s.count(t, "alpha"); return rows == n+1 }, eventually, 5*time.Millisecond)
			}

		})
	}
}

// TestMalformedTriggersAreDeadLettered: garbage, unknown versions and unknown reasons go to the
// dead letters at once, with the reason, and the consumer keeps consuming. A trigger of an
// older build with a catch-up reason ("tick") is no dead letter: it catches up.
func TestMalformedTriggersAreDeadLettered(t *testing.T) {
	t.Parallel()
	eachChannel(t, func(t *testing.T, s *setup, ch channel.Channel) {
		require.NoError(t, ch.Declare(context.Background(), "alpha"))
		// A retry would come after an hour: a dead letter within the test's wait came at once.
		w := s.start(t, ch, worker.Config{SafetyNetInterval: -1, Retry: retry.Policy{InitialInterval: time.Hour, MaxInterval: time.Hour, MaxElapsedTime: -1}},
			s.model(t, "alpha", nil))

		_, topic, err := ch.Subscriber("alpha")
		require.NoError(t, err)
		garbage := message.NewMessage("garbage-1", []byte("\x00\xff not json"))
		future := message.NewMessage("future-1", []byte(`{"v":99,"pos":"1/1"}`))
		later := message.NewMessage("later-1", []byte(`{"v":1,"reason":"later"}`))
		tick := message.NewMessage("tick-1", []byte(`{"v":1,"at":"2026-11-22T10:00:00Z","reason":"tick"}`))
		require.NoError(t, ch.Publisher().Publish(topic, garbage))
		require.NoError(t, ch.Publisher().Publish(topic, future))
		require.NoError(t, ch.Publisher().Publish(topic, later))
		require.NoError(t, ch.Publisher().Publish(topic, tick))

		reasons := map[string]string{}
		for _, rec := range s.awaitDeadLetters(t, 3) {
			reasons[rec.MessageUUID] = rec.Error
		}
		require.Contains(t, reasons["garbage-1"], "not a JSON trigger object")
		require.Contains(t, reasons["future-1"], "version 99")
		require.Contains(t, reasons["later-1"], `unknown reason "later"`)
		// The start-up catch-up, then the tick's: the invalid triggers run none.
		// (The replay at start leaves them alone: they failed after the worker was made.)
		require.Eventually(t, func() bool { st := w.Stats("alpha"); return st.Received == 4 && st.CatchUps >= 2 }, eventually, 5*time.Millisecond,
			"the old tick trigger is received and caught up on")
		require.Equal(t, int64(3), w.Stats("alpha").Invalid, "dead-lettered at once, without a retry")
		require.Len(t, s.awaitDeadLetters(t, 3), 3, "the tick trigger is no dead letter")

		s.append(t, "s", storeEvent(1))
		require.Eventually(t, func() bool { return s.has(t, "alpha", 1) }, eventually, 10*time.Millisecond, "the consumer keeps consuming")
	})
}

// TestGracefulShutdown: stopping the worker while a catch-up is in flight rolls the batch back,
// records no failure and dead-letters nothing; Run returns promptly and leaks no goroutine
// (TestMain checks).
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	eachChannel(t, func(t *testing.T, s *setup, ch channel.Channel) {
		require.NoError(t, ch.Declare(context.Background(), "slow"))

		inHandler := make(chan struct{})
		var once sync.Once
		slow, err := projection.New("slow", projection.Config{}, projection.On("A",
			func(ctx context.Context, _ pgx.Tx, _ projection.Event[projectiontest.Payload]) error {
				once.Do(func() { close(inHandler) })
				<-ctx.Done() // a handler that only stops when the worker does
				return ctx.Err()
			}))
		require.NoError(t, err)
		runner, err := projection.NewRunner(s.backend, projection.RunnerConfig{Logger: s.logger}, slow)
		require.NoError(t, err)
		require.NoError(t, runner.Init(context.Background()))
		// Counts every write, even one that fails because the shutdown ended its context.
		dead := &addCountingStore{Store: s.dead}
		w, err := worker.New(worker.Config{Runner: runner, Channel: ch, Logger: s.logger, SafetyNetInterval: -1, CloseTimeout: eventually,
			DeadLetters: dead})
		require.NoError(t, err)

		res, err := s.store.Append(context.Background(), "s", eventstore.Any, storeEvent(1))
		require.NoError(t, err)
		// Readable before the worker starts: no trigger will come, the start-up catch-up
		// must find it (an open transaction elsewhere in the cluster could hide it briefly).
		storetest.Settle(t, s.store, res.Last())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		select {
		case <-inHandler:
		case <-time.After(eventually):
			t.Fatal("the start-up catch-up never reached the handler")
		}
		// A trigger arrives too: its handler waits for the projection's lock.
		require.NoError(t, ch.Publish(context.Background(), trigger.Trigger{Reason: trigger.ReasonAppend, At: time.Now()}))
		require.Eventually(t, func() bool { return w.Stats("slow").Received == 1 }, eventually, 5*time.Millisecond)
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(eventually):
			t.Fatal("Run did not return after its context ended")
		}

		st, err := runner.Status(context.Background(), "slow")
		require.NoError(t, err)
		require.Equal(t, projection.StateRunning, st.State, "a shutdown is not a failure")
		require.True(t, st.Position.IsZero(), "the batch in flight rolled back")
		require.Zero(t, st.Attempts)
		recs, err := s.dead.List(context.Background(), deadletter.Filter{})
		require.NoError(t, err)
		require.Empty(t, recs, "nothing is dead-lettered on shutdown")
		require.Zero(t, dead.adds.Load(), "no dead letter is even attempted on shutdown")
		require.NoError(t, ch.Close())
	})
}

// addCountingStore counts the calls to Add, whatever they return.
type addCountingStore struct {
	deadletter.Store
	adds atomic.Int64
}

func (s *addCountingStore) Add(ctx context.Context, e deadletter.Entry) (deadletter.Record, error) {
	s.adds.Add(1)
	return s.Store.Add(ctx, e)
}

// TestRedundantTriggersCostNoRead: a trigger for a position the projection has passed, or for
// event types it does not handle, is acked without a catch-up.
func TestRedundantTriggersCostNoRead(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	dropping := &droppingChannel{Channel: s.newChannel(t, channels["gochannel"])} // silences the relay
	ch := dropping.Channel
	res, err := s.store.Append(context.Background(), "s", eventstore.Any, storeEvent(1))
	require.NoError(t, err)
	storetest.Settle(t, s.store, res.Last())
	w := s.start(t, dropping, worker.Config{SafetyNetInterval: -1}, s.model(t, "alpha", nil))
	// The start-up catch-up handles the event; once the worker's runner has taken note of the
	// position it committed (right after the commit), the worker knows what is redundant.
	require.Eventually(t, func() bool { return !s.runner.CommittedPosition("alpha").Less(res.Last()) }, eventually, 5*time.Millisecond)
	require.True(t, s.has(t, "alpha", 1))
	before := w.Stats("alpha")
	require.Equal(t, worker.Stats{CatchUps: 1}, before, "the start-up catch-up, and no trigger yet")

	stale := trigger.ForAppend(res, time.Now())
	otherTypes := trigger.Trigger{Position: eventstore.Position{TransactionID: res.Last().TransactionID + 1000, GlobalPosition: 1}, Types: []string{"B"}, Reason: trigger.ReasonAppend}
	for range 5 {
		require.NoError(t, ch.Publish(context.Background(), stale))
		require.NoError(t, ch.Publish(context.Background(), otherTypes))
	}
	// The handler counts a trigger as received first and then what it did with it: wait until
	// all ten are counted as redundant, or one started a catch-up.
	require.Eventually(t, func() bool {
		st := w.Stats("alpha")
		return st.Received == 10 && (st.Redundant == 10 || st.CatchUps != before.CatchUps)
	}, eventually, 5*time.Millisecond)
	after := w.Stats("alpha")
	require.Equal(t, int64(10), after.Redundant, "before %+v after %+v", before, after)
	require.Equal(t, before.CatchUps, after.CatchUps, "no catch-up, so no read, for redundant triggers")
}

// TestStaleTriggerBacklogCatchesUp: redundant triggers made long ago are a backlog (queued
// through a long catch-up, a version's build, an outage), and the triggers of new events wait
// behind it: one of them now and then starts a catch-up, which handles the new events before
// their own triggers come. Here the new event's trigger never comes (the relay's triggers are
// dropped): only the backlog's catch-up can handle it.
func TestStaleTriggerBacklogCatchesUp(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	dropping := &droppingChannel{Channel: s.newChannel(t, channels["gochannel"])} // silences the relay
	ch := dropping.Channel
	res, err := s.store.Append(context.Background(), "s", eventstore.Any, storeEvent(1))
	require.NoError(t, err)
	storetest.Settle(t, s.store, res.Last())
	w := s.start(t, dropping, worker.Config{SafetyNetInterval: -1}, s.model(t, "alpha", nil))
	require.Eventually(t, func() bool { return !s.runner.CommittedPosition("alpha").Less(res.Last()) }, eventually, 5*time.Millisecond)
	next, err := s.store.Append(context.Background(), "s", eventstore.Any, storeEvent(2))
	require.NoError(t, err)
	storetest.Settle(t, s.store, next.Last())
	require.False(t, s.has(t, "alpha", 2), "no trigger for it yet")

	const backlog = 50
	stale := trigger.ForAppend(res, time.Now().Add(-time.Second))
	started := time.Now()
	for range backlog {
		require.NoError(t, ch.Publish(context.Background(), stale))
	}
	require.Eventually(t, func() bool { return s.has(t, "alpha", 2) }, eventually, 5*time.Millisecond,
		"a stale trigger of the backlog started a catch-up")
	// Received counts a trigger as its handling starts, Redundant once the handler has judged
	// it: the last trigger is worked through once both reach the backlog (a trigger judged
	// otherwise leaves Redundant short: the wait gives up and the assertion below shows the
	// counts).
	assert.Eventually(t, func() bool { st := w.Stats("alpha"); return st.Received == backlog && st.Redundant == backlog },
		eventually, 5*time.Millisecond)
	drained := time.Since(started)
	st := w.Stats("alpha")
	require.Equal(t, int64(backlog), st.Redundant, "%+v", st)
	// At most one catch-up per 20 ms (the worker's backlogRefresh) while the backlog drained,
	// beside the start-up one, however long the draining took on a busy machine.
	require.LessOrEqual(t, st.CatchUps-1, int64(drained/(20*time.Millisecond))+1, "drained in %s: %+v", drained, st)
}

// TestSkipRequest: an operator's skip request travels as a trigger to the projection's worker,
// which skips with the projection's definition — its on-skip hook runs — and carries on.
func TestSkipRequest(t *testing.T) {
	t.Parallel()
	eachChannel(t, func(t *testing.T, s *setup, ch channel.Channel) {
		var hooked atomic.Value
		p, err := projection.New("picky", projection.Config{
			SkipFunc: func(_ context.Context, sp projection.SkipParams) error { hooked.Store(sp.Event.ID); return nil },
		}, projection.OnIdempotent("A", func(_ context.Context, e projection.Event[projectiontest.Payload]) error {
			if e.Data.N == 2 {
				return errors.New("cannot take 2")
			}
			return nil
		}))
		require.NoError(t, err)
		w := s.start(t, ch, worker.Config{SafetyNetInterval: -1, Retry: retry.Policy{MaxAttempts: 1}}, p)
		for n := 1; n <= 3; n++ {
			s.append(t, "s", storeEvent(n))
		}
		runner, err := projection.NewRunner(s.backend, projection.RunnerConfig{Logger: s.logger}, p)
		require.NoError(t, err)
		var st projection.Status
		require.Eventually(t, func() bool {
			st, err = runner.Status(context.Background(), "picky")
			require.NoError(t, err)
			return st.FailingEvent != nil
		}, eventually, 5*time.Millisecond)
		poison := st.FailingEvent.ID

		require.NoError(t, ch.Publish(context.Background(), trigger.Trigger{Projection: "picky", Reason: trigger.ReasonSkip, At: time.Now(),
			Skip: &trigger.SkipRequest{EventID: poison, Reason: "bad data", By: "ann"}}))
		require.Eventually(t, func() bool {
			st, err = runner.Status(context.Background(), "picky")
			require.NoError(t, err)
			return st.LastSkip != nil && st.CaughtUp()
		}, eventually, 5*time.Millisecond)
		require.Equal(t, poison, hooked.Load(), "the projection's on-skip hook ran")
		require.Equal(t, "ann", st.LastSkip.By)
		require.Equal(t, projection.StateRunning, st.State)
		require.Positive(t, w.Stats("picky").Received)
	})
}

// TestStuckCatchUpIsReported: a catch-up that hangs (a handler waiting on something that does
// not answer) is reported as a stall while it hangs, and the projection catches up once it is
// released.
func TestStuckCatchUpIsReported(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	ch := s.newChannel(t, channels["gochannel"])
	w := s.start(t, ch, worker.Config{SafetyNetInterval: 20 * time.Millisecond, StallAfter: 10 * time.Millisecond},
		s.model(t, "stuck", func(int) error { <-release; return nil }))
	for n := range 3 {
		_, err := s.store.Append(context.Background(), "s", eventstore.Any, storeEvent(n))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return w.Stats("stuck").Stalls > 0 }, eventually, 5*time.Millisecond,
		"the hanging catch-up is reported")
	require.Equal(t, int64(1), w.Stats("stuck").Stalls, "once per stall")
	once.Do(func() { close(release) })
	require.Eventually(t, func() bool { rows, _ := s.count(t, "stuck"); return rows == 3 }, eventually, 5*time.Millisecond)
}
