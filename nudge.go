// Package nudge is the client: one value that wires nudge's parts for a service — the event
// store, the projections' runner and handlers, the dead letters, the relay that publishes
// triggers, the safety net and the replay after deploy — from a pgx pool, a channel and the
// projections.
//
//	client, err := nudge.New(pool, nudge.Config{Channel: ch, Projections: []*projection.Projection{list}})
//	err = client.Migrate(ctx)                   // every start; safe from several processes
//	go func() { done <- client.Run(ctx) }()     // handlers, relay, safety net, replay after deploy
//	<-client.Running()                          // handlers subscribed: ready
//	_, err = client.Append(ctx, "ticket-1", eventstore.NoStream, data)
//
// Handlers can run on a Watermill router of the service's own instead: AddHandlers adds them,
// and RunRouter runs that router beside everything else Run runs, stopping both when either
// fails (RunBackground runs the rest alone, for a router you run yourself). A process that
// only appends and serves read models and statuses, beside others that Run, calls Prepare
// instead, and needs no channel (Config.Channel nil): it opens no broker connection. The parts
// stay available for custom wiring (packages eventstore/postgres, projection, worker, relay,
// deadletter, postgres).
package nudge

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/deadletter"
	dlmemory "github.com/nudgeworks/nudge/deadletter/memory"
	dlpg "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/eventstore"
	esmemory "github.com/nudgeworks/nudge/eventstore/memory"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/tracing"
	"github.com/nudgeworks/nudge/metrics"
	"github.com/nudgeworks/nudge/postgres"
	"github.com/nudgeworks/nudge/projection"
	pjmemory "github.com/nudgeworks/nudge/projection/memory"
	pjpg "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/worker"
)

// ErrRunTwice is returned by a second Run or RunBackground of one Client: a Client runs once.
var ErrRunTwice = errors.New("nudge: the client runs already (or ran): a Client runs once, by Run or by RunBackground")

// ErrNotSupported is returned by AppendTx on an in-memory client: it has no transactions.
var ErrNotSupported = errors.New("nudge: not supported by this client")

// Client is nudge wired for one service. It is safe for concurrent use.
type Client struct {
	cfg      Config
	store    eventstore.Store
	pg       *espg.Store // nil in memory
	appender *relay.Appender
	runner   *projection.Runner
	worker   *worker.Worker
	relay    *relay.Relay // nil with TriggersInTransaction, and without a channel
	backend  projection.Backend
	// listener wakes the relay on appends (nil in memory, or when db is not a pool).
	listener *postgres.Listener
	dead     deadletter.Store
	migrate  func(context.Context) error // nil in memory
	ran      atomic.Bool
	routers  sync.Map    // *message.Router → true: the routers AddHandlers added the handlers to
	watched  atomic.Bool // Config.Metrics watches the worker
	tracer   *tracing.Tracer
}

// parts are what a client is built on: the PostgreSQL or the in-memory implementations.
type parts struct {
	store   eventstore.Store
	pg      *espg.Store
	backend projection.Backend
	dead    deadletter.Store
	migrate func(context.Context) error
	// listener, if set, wakes the relay on appends.
	listener *postgres.Listener
	// db holds the partition leases (nil in memory: one process runs every partition).
	db postgres.DB
}

// New returns a client on PostgreSQL: the event store, projection positions and status and (by
// default) the dead letters live in db's database, in Config.Schema. It connects to nothing
// until it is used; call Migrate once per start before Run.
func New(db postgres.DB, cfg Config) (*Client, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: New needs a database (a *pgxpool.Pool)", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	store, err := espg.New(db, espg.Config{Schema: cfg.Schema, Limits: cfg.Limits, SessionConnect: cfg.SessionConnect})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	backend, err := pjpg.New(store)
	if err != nil {
		return nil, err
	}
	components := []postgres.Component{postgres.ComponentEvents, postgres.ComponentProjections}
	p := parts{store: store, pg: store, backend: backend, dead: cfg.DeadLetters, db: db}
	if p.listener, err = relayListener(db, cfg); err != nil {
		return nil, err
	}
	if p.dead == nil {
		dead, err := dlpg.New(db, dlpg.Config{Schema: cfg.Schema})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		p.dead, components = dead, append(components, postgres.ComponentDeadLetters)
	}
	p.migrate = func(ctx context.Context) error { return postgres.Migrate(ctx, db, cfg.Schema, components...) }
	return newClient(cfg, p)
}

// relayListener returns the listener that wakes the relay on appends, or nil when the relay
// polls only. Appends notify postgres.NotifyEvents; the relay listens, and polls as a fallback.
func relayListener(db postgres.DB, cfg Config) (*postgres.Listener, error) {
	if cfg.TransactionPooling {
		if err := checkTransactionPooling(db, cfg); err != nil {
			return nil, err
		}
	}
	if cfg.Triggers != TriggersRelay || cfg.Channel == nil || cfg.Relay.Waker != nil || cfg.DisableListen {
		return nil, nil
	}
	connect := cfg.SessionConnect
	if connect == nil {
		if cfg.TransactionPooling {
			return nil, fmt.Errorf("%w: TransactionPooling: %w: the relay LISTENs for appends on a connection of its own: "+
				"set Config.SessionConnect to a direct connection (postgres.PoolConnect(directPool)), or Config.DisableListen to poll only",
				ErrInvalidConfig, postgres.ErrSessionNeeded)
		}
		pool, ok := db.(interface {
			Acquire(ctx context.Context) (*pgxpool.Conn, error)
		})
		if !ok {
			return nil, nil
		}
		connect = postgres.PoolConnect(pool)
	}
	return postgres.NewListener(connect, postgres.ListenerConfig{Channel: postgres.NotifyEvents, Logger: cfg.Logger})
}

// checkTransactionPooling refuses, behind a pooler in transaction mode, a pool that prepares
// statements by name and a partitioned projection without a direct connection for its index.
func checkTransactionPooling(db postgres.DB, cfg Config) error {
	if err := postgres.CheckTransactionPooling(db); err != nil {
		return fmt.Errorf("%w: TransactionPooling: %w", ErrInvalidConfig, err)
	}
	for _, p := range cfg.Projections {
		if p.Partitions() > 1 && cfg.SessionConnect == nil {
			return fmt.Errorf("%w: TransactionPooling: %w: projection %s is partitioned: its event index is built under a session advisory lock: "+
				"set Config.SessionConnect to a direct connection (postgres.PoolConnect(directPool))", ErrInvalidConfig, postgres.ErrSessionNeeded, p.Name())
		}
	}
	return nil
}

// NewInMemory returns a client whose event store, projection positions and dead letters live
// in memory, for tests and demos. Use it with channel/gochannel; TriggersInTransaction is not
// available.
func NewInMemory(cfg Config) (*Client, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Triggers == TriggersInTransaction {
		return nil, fmt.Errorf("%w: Triggers %q needs PostgreSQL: use New", ErrInvalidConfig, cfg.Triggers)
	}
	store, err := esmemory.New(esmemory.Config{Limits: cfg.Limits})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	backend, err := pjmemory.New(store, pjmemory.Config{})
	if err != nil {
		return nil, err
	}
	dead := cfg.DeadLetters
	if dead == nil {
		dead = dlmemory.New(dlmemory.Config{})
	}
	return newClient(cfg, parts{store: store, backend: backend, dead: dead})
}

func newClient(cfg Config, p parts) (*Client, error) {
	c := &Client{cfg: cfg, store: p.store, pg: p.pg, dead: p.dead, migrate: p.migrate, listener: p.listener, backend: p.backend,
		tracer: tracing.New(cfg.TracerProvider)}
	var err error
	c.runner, err = projection.NewRunner(p.backend, projection.RunnerConfig{Logger: cfg.Logger, OnBatch: onBatch(cfg), OnCatchUp: onCatchUp(cfg),
		TracerProvider: cfg.TracerProvider}, cfg.Projections...)
	if err != nil {
		return nil, err
	}
	wcfg := workerConfig(cfg, c, p)
	switch cfg.Triggers {
	case TriggersInTransaction:
		c.appender, err = relay.NewAppender(c.pg, cfg.Channel.(relay.TxPublisher)) // checked by Validate
		if err != nil {
			return nil, err
		}
		// A trigger published in the append's transaction can arrive before an older
		// transaction lets readers see its events: its handler waits for them.
		wcfg.Store = c.pg
	case TriggersRelay:
		if cfg.Channel == nil {
			break // no relay: the processes that run the projections run it
		}
		rcfg := cfg.Relay
		if rcfg.TracerProvider == nil {
			rcfg.TracerProvider = cfg.TracerProvider
		}
		rcfg.BatchFunc = relayBatchFunc(cfg.Metrics, rcfg.BatchFunc)
		if p.listener != nil {
			rcfg.Waker = p.listener
		}
		c.relay, err = relay.New(p.backend, cfg.Channel, rcfg)
		if err != nil {
			return nil, fmt.Errorf("%w: Relay: %w", ErrInvalidConfig, err)
		}
	}
	c.worker, err = worker.New(wcfg)
	if err != nil {
		return nil, err
	}
	if m := cfg.Metrics; m != nil {
		// The worker's trigger counters are watched once its handlers are added (watchWorker).
		if err := errors.Join(m.WatchRunner(c.runner), m.WatchDeadLetters(c.dead, c.runner.Names()...)); err != nil {
			return nil, fmt.Errorf("nudge: metrics: %w", err)
		}
	}
	return c, nil
}

// workerConfig is the worker's configuration of client c, built on p, before the trigger
// mode's part (newClient).
func workerConfig(cfg Config, c *Client, p parts) worker.Config {
	var ch channel.Channel = noChannel{}
	if cfg.Channel != nil {
		ch = cfg.Channel
	}
	wcfg := worker.Config{Runner: c.runner, Channel: ch, Logger: cfg.Logger, DeadLetters: c.dead,
		SafetyNetInterval: cfg.SafetyNetInterval, StallAfter: cfg.StallAfter, Retry: cfg.Retry,
		DisableReplayOnStart: cfg.DisableReplayOnStart, CloseTimeout: cfg.CloseTimeout, RouterFunc: routerFunc(cfg),
		DeadLetterTimeout: cfg.DeadLetterTimeout, TracerProvider: cfg.TracerProvider}
	if cfg.Metrics != nil {
		wcfg.TriggerFunc = cfg.Metrics.ObserveTrigger
	}
	if c.pg != nil {
		wcfg.Horizon = c.pg // names the transaction that holds readers back
	}
	if p.db != nil {
		// Partitioned projections spread over every process that runs them.
		wcfg.Leases = &worker.Leases{DB: p.db, Schema: cfg.Schema, Owner: cfg.WorkerID}
	}
	return wcfg
}

// watchWorker has Config.Metrics watch the worker's trigger counters, once, when the handlers
// are added (Run, AddHandlers): a client that only appends and reports status (Prepare) shows
// no counters that nothing updates.
func (c *Client) watchWorker() error {
	if c.cfg.Metrics == nil || !c.watched.CompareAndSwap(false, true) {
		return nil
	}
	if err := c.cfg.Metrics.WatchWorker(c.worker, c.runner.Names()...); err != nil {
		return fmt.Errorf("nudge: metrics: %w", err)
	}
	return nil
}

// onBatch is Config.OnBatch, and Config.Metrics' batch counters.
func onBatch(cfg Config) func(projection.BatchReport) {
	switch {
	case cfg.Metrics == nil:
		return cfg.OnBatch
	case cfg.OnBatch == nil:
		return cfg.Metrics.ObserveBatch
	}
	return func(b projection.BatchReport) {
		cfg.Metrics.ObserveBatch(b)
		cfg.OnBatch(b)
	}
}

// relayBatchFunc is the relay's BatchFunc fn, and m's relay delay if m is set.
func relayBatchFunc(m *metrics.Metrics, fn func(projection.BatchReport)) func(projection.BatchReport) {
	switch {
	case m == nil:
		return fn
	case fn == nil:
		return m.ObserveRelay
	}
	return func(b projection.BatchReport) {
		m.ObserveRelay(b)
		fn(b)
	}
}

// onCatchUp is Config.Metrics' catch-up counters, if set.
func onCatchUp(cfg Config) func(string, projection.Result, error) {
	if cfg.Metrics == nil {
		return nil
	}
	return cfg.Metrics.ObserveCatchUp
}

// routerFunc is Config.RouterFunc, after Config.Metrics' router metrics.
func routerFunc(cfg Config) func(*message.Router) error {
	if cfg.Metrics == nil {
		return cfg.RouterFunc
	}
	return func(r *message.Router) error {
		if err := cfg.Metrics.AddRouterMetrics(r); err != nil {
			return err
		}
		if cfg.RouterFunc != nil {
			return cfg.RouterFunc(r)
		}
		return nil
	}
}

// Migrate creates or updates every table the client uses — the event store's, the projections'
// status and the dead letters' in one transaction (postgres.Migrate), then the channel's queue
// tables (channel/postgres). It is safe to run at every start, from several processes at once,
// and as a role that may only read and write nudge's tables: with nothing to migrate it
// changes no schema, and when there is something to migrate such a role gets an error matching
// postgres.ErrPrivilege that says to migrate once as the tables' owner.
func (c *Client) Migrate(ctx context.Context) error {
	if c.migrate != nil {
		if err := c.migrate(ctx); err != nil {
			return err
		}
	}
	if m, ok := c.cfg.Channel.(interface{ Migrate(context.Context) error }); ok {
		return m.Migrate(ctx)
	}
	return nil
}

// Append appends events to the stream streamID if it satisfies expected, and makes sure the
// projections hear of it (through the relay, or in the append's transaction with
// TriggersInTransaction). See eventstore.Store.Append for the errors.
func (c *Client) Append(ctx context.Context, streamID string, expected eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error) {
	ctx, span := c.tracer.Start(ctx, tracing.SpanAppend, trace.SpanKindProducer)
	if span.IsRecording() {
		events = tracing.WithTraceContext(ctx, events)
	}
	res, err := c.append(ctx, streamID, expected, events)
	endAppend(span, streamID, res, err)
	return res, err
}

// endAppend ends an append's span.
func endAppend(span trace.Span, streamID string, res eventstore.AppendResult, err error) {
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrStream.String(streamID), tracing.AttrEvents.Int(len(res.Events)),
			tracing.AttrIdempotent.Bool(res.Idempotent))
		if len(res.Events) > 0 {
			span.SetAttributes(tracing.AttrPositionFrom.String(res.Events[0].Position.String()), tracing.AttrPositionTo.String(res.Last().String()))
		}
	}
	tracing.End(span, err)
}

func (c *Client) append(ctx context.Context, streamID string, expected eventstore.ExpectedVersion, events []eventstore.EventData) (eventstore.AppendResult, error) {
	if c.appender != nil {
		return c.appender.Append(ctx, streamID, expected, events...)
	}
	res, err := c.store.Append(ctx, streamID, expected, events...)
	if err == nil && c.relay != nil {
		c.relay.Wake()
	}
	return res, err
}

// AppendTx appends inside tx, so a command handler writes its own rows and the events
// atomically (see eventstore/postgres.Store.AppendTx); the trigger follows the commit. On an
// error the caller rolls tx back. An in-memory client returns ErrNotSupported.
func (c *Client) AppendTx(ctx context.Context, tx pgx.Tx, streamID string, expected eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error) {
	ctx, span := c.tracer.Start(ctx, tracing.SpanAppend, trace.SpanKindProducer)
	if span.IsRecording() {
		events = tracing.WithTraceContext(ctx, events)
	}
	res, err := c.appendTx(ctx, tx, streamID, expected, events)
	endAppend(span, streamID, res, err)
	return res, err
}

func (c *Client) appendTx(ctx context.Context, tx pgx.Tx, streamID string, expected eventstore.ExpectedVersion, events []eventstore.EventData) (eventstore.AppendResult, error) {
	switch {
	case c.appender != nil:
		return c.appender.AppendTx(ctx, tx, streamID, expected, events...)
	case c.pg != nil:
		return c.pg.AppendTx(ctx, tx, streamID, expected, events...)
	}
	return eventstore.AppendResult{}, fmt.Errorf("AppendTx: %w: an in-memory client has no transactions", ErrNotSupported)
}

// Status returns the named projection's status: position, lag, condition, the failing event.
func (c *Client) Status(ctx context.Context, name string) (projection.Status, error) {
	return c.runner.Status(ctx, name)
}

// Statuses returns the status of every projection of the client.
func (c *Client) Statuses(ctx context.Context) ([]projection.Status, error) {
	return c.runner.Statuses(ctx)
}

// WaitCaughtUp waits until the named projections (all of the client's if none are named) have
// handled every event readable when it was called; see projection.Runner.WaitCaughtUp.
func (c *Client) WaitCaughtUp(ctx context.Context, names ...string) error {
	return c.runner.WaitCaughtUp(ctx, names...)
}

// Parked returns the named projection's parked streams (projection.Config.OnFailure =
// projection.OnFailurePark), oldest first.
func (c *Client) Parked(ctx context.Context, name string) ([]projection.ParkedStream, error) {
	return c.runner.Parked(ctx, name)
}

// Redrive applies the parked events of one stream of the named projection, in order, through
// the current handlers, and unparks it (every parked stream when streamID is ""); by is
// recorded with the redrive. It returns the number of streams unparked. See
// projection.Runner.Redrive: a failing redrive leaves the stream parked with the new error.
func (c *Client) Redrive(ctx context.Context, name, streamID, by string) (int, error) {
	if streamID == "" {
		return c.runner.RedriveAll(ctx, name, by)
	}
	if _, err := c.runner.Redrive(ctx, name, streamID, by); err != nil {
		return 0, err
	}
	return 1, nil
}

// Replay replays the dead letters f selects on the client's channel, recording by as who
// replayed them: see deadletter.Replay. It runs in a span (nudge.deadletter.replay) whose
// trace the replayed triggers' spans, and the batches they start, continue. A client without a
// channel returns an error matching ErrNoChannel.
func (c *Client) Replay(ctx context.Context, f deadletter.ReplayFilter, by string) (deadletter.ReplayResult, error) {
	if c.cfg.Channel == nil {
		return deadletter.ReplayResult{}, fmt.Errorf("nudge: Replay publishes its triggers: %w", ErrNoChannel)
	}
	return deadletter.Replay(ctx, c.dead, c.cfg.Channel, f, by, time.Time{}, deadletter.WithTracerProvider(c.cfg.TracerProvider))
}

// Store returns the event store, for reads (Read, ReadStream, Head).
func (c *Client) Store() eventstore.Store { return c.store }

// Runner returns the projections' runner: pause, resume, reset, skip, status, parked streams
// (SkipParked, PurgeParked).
func (c *Client) Runner() *projection.Runner { return c.runner }

// DeadLetters returns the dead-letter store (deadletter.Replay, List, Resolve).
func (c *Client) DeadLetters() deadletter.Store { return c.dead }

// Relay returns the relay that publishes the triggers (its Status); nil with
// TriggersInTransaction.
func (c *Client) Relay() *relay.Relay { return c.relay }

// RelayStatus returns the status of the relay that publishes the projections' triggers: its
// position and lag behind the store. A client without a channel (an API process beside the
// workers) reads it too: it is the status of the relay the workers run, read from the
// database. Before any relay has run it returns an error wrapping
// projection.ErrNotRegistered; with TriggersInTransaction, or a channel-less in-memory client,
// ErrNotSupported.
func (c *Client) RelayStatus(ctx context.Context) (projection.Status, error) {
	if c.relay != nil {
		return c.relay.Status(ctx)
	}
	of, ok := c.backend.(interface {
		StatusOf(ctx context.Context, name string) (projection.Status, error)
	})
	if c.cfg.Triggers != TriggersRelay || !ok {
		return projection.Status{}, fmt.Errorf("RelayStatus: %w: this client has no relay (Triggers %q)", ErrNotSupported, c.cfg.Triggers)
	}
	name := cmp.Or(c.cfg.Relay.Name, relay.NameDefault)
	st, err := of.StatusOf(ctx, name)
	if errors.Is(err, projection.ErrNotRegistered) {
		return st, fmt.Errorf("relay %s has not run yet: %w", name, err)
	}
	return st, err
}

// Worker returns the worker that runs the projections' handlers (its Stats).
func (c *Client) Worker() *worker.Worker { return c.worker }
