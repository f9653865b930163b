package nudge_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge"
	"github.com/nudgeworks/nudge/channel"
	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	"github.com/nudgeworks/nudge/channel/gochannel"
	pgchannel "github.com/nudgeworks/nudge/channel/postgres"
	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testlog"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/metrics"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/worker"
)

var eventually = testwait.For(time.Minute)

type ticketRegistered struct {
	ID   string `json:"id"`
	Type string `json:"type"`
}

// ticketList is the seed story's projection: its ticket_type column is too short for one type.
func ticketList(t testing.TB) *projection.Projection {
	t.Helper()
	return ticketListWith(t, projection.Config{})
}

// ticketListWith is ticketList with cfg (its InitFunc replaced).
func ticketListWith(t testing.TB, cfg projection.Config) *projection.Projection {
	t.Helper()
	cfg.InitFunc = func(ctx context.Context, p projection.HookParams) error {
		_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS ticket_list (id text PRIMARY KEY, ticket_type varchar(25) NOT NULL, applied int NOT NULL)`)
		return err
	}
	p, err := projection.New("ticket_list", cfg, projection.On("TicketRegistered", func(ctx context.Context, tx pgx.Tx, e projection.Event[ticketRegistered]) error {
		_, err := tx.Exec(ctx, `INSERT INTO ticket_list VALUES ($1, $2, 1) ON CONFLICT (id) DO UPDATE SET applied = ticket_list.applied + 1`,
			e.Data.ID, e.Data.Type)
		return err
	}))
	require.NoError(t, err)
	return p
}

// story is one variant of the seed story: a channel, a trigger mode and how handlers run.
type story struct {
	channel   string // amqp, postgres
	triggers  nudge.TriggerMode
	ownRouter bool
}

// TestSeedStory: the story nudge exists for, wired with the client only: a poison event is
// retried and dead-lettered naming the event while later events wait; the fix is deployed (the
// column widened, the service restarted) and the projection heals with no command — the replay
// after deploy — on RabbitMQ and on the PostgreSQL queue, with the relay and with triggers in the
// append's transaction, with Run and with handlers on the service's own router.
func TestSeedStory(t *testing.T) {
	t.Parallel()
	stories := []story{
		{"amqp", nudge.TriggersRelay, false},
		{"amqp", nudge.TriggersRelay, true},
		{"postgres", nudge.TriggersRelay, false},
		{"postgres", nudge.TriggersRelay, true},
		{"postgres", nudge.TriggersInTransaction, false},
		{"postgres", nudge.TriggersInTransaction, true},
	}
	for _, s := range stories {
		t.Run(fmt.Sprintf("%s/%s/own-router=%t", s.channel, s.triggers, s.ownRouter), func(t *testing.T) {
			t.Parallel()
			seedStory(t, s)
		})
	}
}

func seedStory(t *testing.T, s story) {
	ctx := context.Background()
	db := pgtest.New(t)
	pool := db.NewPool(t, 24)
	logger := testlog.New(t)
	var ch channel.Channel
	switch s.channel {
	case "amqp":
		env := amqptest.New(t)
		c, err := amqpchannel.New(ctx, amqpchannel.Config{URL: env.URL, Prefix: env.Prefix, ConnectionName: env.ConnectionName, Logger: logger})
		require.NoError(t, err)
		ch = c
	case "postgres":
		c, err := pgchannel.New(pool, pgchannel.Config{PollInterval: 10 * time.Millisecond, Logger: logger})
		require.NoError(t, err)
		ch = c
	}
	t.Cleanup(func() { require.NoError(t, ch.Close()) })
	cfg := nudge.Config{
		Channel: ch, Projections: []*projection.Projection{ticketList(t)}, Logger: logger, Triggers: s.triggers,
		SafetyNetInterval: -1, // only triggers and the replay after deploy heal here
		Retry:             retry.Policy{MaxAttempts: 3, InitialInterval: 20 * time.Millisecond, MaxInterval: 50 * time.Millisecond},
	}
	client := start(t, pool, cfg, s.ownRouter)
	register := func(id, typ string) {
		data, err := eventstore.NewEventData("TicketRegistered", ticketRegistered{ID: id, Type: typ})
		require.NoError(t, err)
		_, err = client.Append(ctx, "ticket-"+id, eventstore.NoStream, data)
		require.NoError(t, err)
	}
	count := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ticket_list`).Scan(&n))
		return n
	}

	register("1", "bug")
	register("2", strings.Repeat("x", 30)) // poison: too long for the column
	register("3", "question")
	var rec deadletter.Record
	require.Eventually(t, func() bool {
		recs, err := client.DeadLetters().List(ctx, deadletter.Filter{Projection: "ticket_list"})
		require.NoError(t, err)
		if len(recs) == 0 {
			return false
		}
		rec = recs[0]
		return true
	}, eventually, 10*time.Millisecond, "the poison trigger is dead-lettered")
	require.Contains(t, rec.Error, "value too long")
	require.Equal(t, deadletter.StatusFailed, rec.Status)
	require.NotNil(t, rec.FailingEvent)
	st, err := client.Status(ctx, "ticket_list")
	require.NoError(t, err)
	require.Equal(t, projection.ConditionFailing, st.Condition())
	require.Equal(t, 1, count(), "the events after the poison wait: none skipped")
	client.stop()

	// Deploy the fix: the column is widened and the service starts again — no command.
	_, err = pool.Exec(ctx, `ALTER TABLE ticket_list ALTER COLUMN ticket_type TYPE varchar(100)`)
	require.NoError(t, err)
	cfg.Projections = []*projection.Projection{ticketList(t)}
	client = start(t, pool, cfg, s.ownRouter)
	waitCtx := testwait.Context(t, time.Minute)
	require.NoError(t, client.WaitCaughtUp(waitCtx, "ticket_list"))
	require.Equal(t, 3, count(), "every event projected")
	var wrong int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ticket_list WHERE applied <> 1`).Scan(&wrong))
	require.Zero(t, wrong, "each once")
	require.Eventually(t, func() bool {
		rec, err = client.DeadLetters().Get(ctx, rec.ID)
		require.NoError(t, err)
		return rec.Status == deadletter.StatusReplayed
	}, eventually, 10*time.Millisecond, "the dead letter is replayed at start")
	require.Equal(t, "worker start", rec.ReplayedBy)
	st, err = client.Status(ctx, "ticket_list")
	require.NoError(t, err)
	require.Nil(t, st.FailingEvent)
	client.stop()
}

// running is a started client and how to stop it.
type running struct {
	*nudge.Client
	stop func()
}

// start migrates and runs a client: with Run, or with its handlers on a router of the test's own
// (AddHandlers, RunRouter), the way a service that owns its router wires them.
func start(t *testing.T, pool *pgxpool.Pool, cfg nudge.Config, ownRouter bool) running {
	t.Helper()
	client, err := nudge.New(pool, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, client.Migrate(ctx))
	var wg sync.WaitGroup
	if ownRouter {
		router, err := message.NewRouter(message.RouterConfig{}, worker.RouterLogger(watermill.NewSlogLogger(cfg.Logger)))
		require.NoError(t, err)
		require.NoError(t, client.AddHandlers(ctx, router))
		wg.Go(func() { require.NoError(t, client.RunRouter(ctx, router)) })
	} else {
		wg.Go(func() { require.NoError(t, client.Run(ctx)) })
	}
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	select {
	case <-client.Running():
	case <-time.After(eventually):
		t.Fatalf("the client did not start within %s", eventually)
	}
	return running{client, stop}
}

// TestConfigErrors: a Config New cannot use is refused with an error matching
// nudge.ErrInvalidConfig that names the field.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	p := ticketList(t)
	ps := []*projection.Projection{p}
	gc, err := gochannel.New(gochannel.Config{})
	require.NoError(t, err)
	cases := map[string]struct {
		cfg  nudge.Config
		want string
	}{
		"in-tx without a channel":      {nudge.Config{Triggers: nudge.TriggersInTransaction}, "needs a Channel"},
		"in-tx on gochannel":           {nudge.Config{Channel: gc, Triggers: nudge.TriggersInTransaction}, "publishes in a transaction"},
		"unknown mode":                 {nudge.Config{Channel: gc, Triggers: "carrier-pigeon"}, "is not one of"},
		"nil projection":               {nudge.Config{Channel: gc, Projections: []*projection.Projection{nil}}, "Projections[0] is nil"},
		"projection twice":             {nudge.Config{Channel: gc, Projections: []*projection.Projection{p, p}}, "listed twice"},
		"no projections":               {nudge.Config{Channel: gc}, "Projections is empty"},
		"negative close wait":          {nudge.Config{Channel: gc, Projections: ps, CloseTimeout: -time.Second}, "CloseTimeout"},
		"negative dead-letter timeout": {nudge.Config{Channel: gc, Projections: ps, DeadLetterTimeout: -time.Second}, "DeadLetterTimeout"},
		"bad schema":                   {nudge.Config{Channel: gc, Projections: ps, Schema: "Robert'); DROP"}, "chema"},
		"bad retry":                    {nudge.Config{Channel: gc, Projections: ps, Retry: retry.Policy{MaxAttempts: -1}}, "Retry"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := nudge.New(db.Pool, c.cfg)
			require.ErrorIs(t, err, nudge.ErrInvalidConfig)
			require.ErrorContains(t, err, c.want)
		})
	}
	_, err = nudge.New(nil, nudge.Config{Channel: gc})
	require.ErrorIs(t, err, nudge.ErrInvalidConfig)
	_, err = nudge.NewInMemory(nudge.Config{Channel: gc, Triggers: nudge.TriggersInTransaction})
	require.ErrorIs(t, err, nudge.ErrInvalidConfig)
}

// TestRunNotMigrated: Run on a database where Migrate never ran fails at once, saying so.
func TestRunNotMigrated(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ch, err := gochannel.New(gochannel.Config{})
	require.NoError(t, err)
	client, err := nudge.New(db.Pool, nudge.Config{Channel: ch,
		Projections: []*projection.Projection{ticketList(t)}, Logger: testlog.New(t)})
	require.NoError(t, err)
	err = client.Run(testwait.Context(t, time.Minute))
	require.ErrorIs(t, err, eventstore.ErrNotMigrated)
	require.ErrorContains(t, err, "Client.Migrate")
	require.ErrorIs(t, client.Run(context.Background()), nudge.ErrRunTwice, "a Client runs once")
	require.ErrorIs(t, client.RunBackground(context.Background()), nudge.ErrRunTwice)
}

// TestMetrics: with Config.Metrics the client measures its batches, the events' staleness,
// statuses, triggers and their transit, dead letters and Run's router on one registry, with
// the projection's label, and the relay's delay with the relay's.
func TestMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg, CacheTTL: -1})
	require.NoError(t, err)
	client := newMemoryClient(t, nudge.Config{Metrics: m})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- client.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	<-client.Worker().Running()

	data, err := eventstore.NewEventData("TicketRegistered", ticketRegistered{ID: "1", Type: "bug"})
	require.NoError(t, err)
	_, err = client.Append(ctx, "ticket-1", eventstore.NoStream, data)
	require.NoError(t, err)
	require.NoError(t, client.WaitCaughtUp(testwait.Context(t, time.Minute)))
	require.Eventually(t, func() bool {
		families, err := reg.Gather()
		require.NoError(t, err)
		seen := map[string]bool{}
		for _, f := range families {
			for _, metric := range f.GetMetric() {
				for _, l := range metric.GetLabel() {
					if (l.GetName() == "projection" && l.GetValue() == "ticket_list") || (l.GetName() == "relay" && l.GetValue() == relay.NameDefault) {
						seen[f.GetName()] = true
					}
				}
			}
		}
		return seen["nudge_projection_events_projected_total"] && seen["nudge_projection_lag_events"] &&
			seen["nudge_worker_triggers_received_total"] && seen["nudge_router_handler_execution_time_seconds"] &&
			seen["nudge_projection_event_staleness_seconds"] && seen["nudge_projection_trigger_transit_seconds"] &&
			seen["nudge_relay_delay_seconds"]
	}, eventually, 10*time.Millisecond, "batches, staleness, statuses, triggers and their transit, the relay's delay and the router are measured")
}

// TestPrepare: a client that only appends and reports status — an API beside workers that Run
// — prepares the projections without running them: their init hooks create the read models,
// their statuses are there, their subscriptions keep the triggers for a handler, and its
// metrics show no trigger counters, which only the handlers update. Run adds those.
func TestPrepare(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	logger := testlog.New(t)
	ch, err := pgchannel.New(db.Pool, pgchannel.Config{PollInterval: 10 * time.Millisecond, Logger: logger})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ch.Close()) })
	reg := prometheus.NewRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg, CacheTTL: -1})
	require.NoError(t, err)
	// Triggers in the append's transaction: no relay, so the append's is the only trigger.
	client, err := nudge.New(db.Pool, nudge.Config{Channel: ch, Projections: []*projection.Projection{ticketList(t)}, Logger: logger,
		Triggers: nudge.TriggersInTransaction, Metrics: m, SafetyNetInterval: -1})
	require.NoError(t, err)
	require.NoError(t, client.Migrate(ctx))
	require.NoError(t, client.Prepare(ctx))
	require.NoError(t, client.Prepare(ctx), "idempotent")

	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM ticket_list`).Scan(&n), "the init hook created the read model")
	data, err := eventstore.NewEventData("TicketRegistered", ticketRegistered{ID: "1", Type: "bug"})
	require.NoError(t, err)
	_, err = client.Append(ctx, "ticket-1", eventstore.NoStream, data)
	require.NoError(t, err)
	st, err := client.Status(ctx, "ticket_list")
	require.NoError(t, err, "the status is there")
	require.Zero(t, st.EventsProcessed)
	seen := func() map[string]bool {
		families, err := reg.Gather()
		require.NoError(t, err)
		names := map[string]bool{}
		for _, f := range families {
			names[f.GetName()] = true
		}
		return names
	}
	require.True(t, seen()["nudge_projection_lag_events"])
	require.False(t, seen()["nudge_worker_triggers_received_total"], "no handlers, no trigger counters")

	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- client.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	require.Eventually(t, func() bool {
		return client.Worker().Stats("ticket_list").Received == 1 && seen()["nudge_worker_triggers_received_total"]
	}, eventually, 10*time.Millisecond, "the append's trigger waited for Run's handler, and its counters are measured")
}

// TestWaitCaughtUpBeforeRun: WaitCaughtUp called before Run has registered the projections
// waits for them (a projection no worker has started is not caught up) instead of failing.
func TestWaitCaughtUpBeforeRun(t *testing.T) {
	t.Parallel()
	client := newMemoryClient(t, nudge.Config{})
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	err := client.WaitCaughtUp(short)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "ticket_list not registered yet")

	waited := make(chan error, 1)
	go func() { waited <- client.WaitCaughtUp(testwait.Context(t, time.Minute)) }()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- client.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	require.NoError(t, <-waited)
}

// newMemoryClient returns an in-memory client of cfg on a GoChannel of its own, with one
// projection, ticket_list, that accepts every TicketRegistered.
func newMemoryClient(t *testing.T, cfg nudge.Config) *nudge.Client {
	t.Helper()
	list, err := projection.New("ticket_list", projection.Config{},
		projection.OnIdempotent("TicketRegistered", func(context.Context, projection.Event[ticketRegistered]) error { return nil }))
	require.NoError(t, err)
	ch, err := gochannel.New(gochannel.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	cfg.Channel, cfg.Projections, cfg.Logger = ch, []*projection.Projection{list}, testlog.New(t)
	client, err := nudge.NewInMemory(cfg)
	require.NoError(t, err)
	return client
}
