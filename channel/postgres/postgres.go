// Package postgres is the PostgreSQL channel: triggers travel through queue tables in the event
// store's database, with watermill-sql v4 (its PostgreSQL queue schema and pgx adapters), so an
// append can publish its trigger in its own transaction (PublishTx): if the events commit, the
// triggers are committed with them, and if the process dies right after the commit nothing is
// lost.
//
// Such a trigger is visible the moment the append commits, which can be before the event
// store may read its events: the store reads only below the oldest transaction still running,
// and an older one may still run. A handler that reaches less than the trigger's position
// should retry until it gets there rather than ack, or the events wait for the next trigger.
//
// # Tables and topics
//
// Declare creates two tables (embedded migrations, component "channel", in Config.Schema):
//
//   - nudge_channel_subscriptions, the registry of declared projections;
//   - nudge_channel_triggers, one queue for the triggers of every projection, with a
//     projection column and an index on (projection, offset).
//
// Publish fans out at publish time, in one statement: INSERT … SELECT from the registry gives
// every declared projection its own row, including projections declared only by other
// processes; a trigger addressed to one projection gets that projection's row only. Each
// projection's subscription is the Watermill topic "nudge.triggers:<projection>", which
// watermill-sql's PostgreSQLQueueSchema maps to the shared table with the where clause
// projection = $1. Projection names reach SQL only as query arguments, after
// name.Validate; Config.Schema is checked by New. Payloads are BYTEA, so raw
// publishes may carry any bytes. A projection that is deleted for good
// should be removed with Undeclare, or publishers keep queueing triggers for it.
//
// # No row locks while a handler runs
//
// watermill-sql's subscriber keeps its transaction open while the handler runs, and the queue
// schema's SELECT ends with FOR UPDATE. A row lock gives the transaction a transaction id, and
// the event store reads only below the oldest running transaction id of the whole cluster. A
// projection's handler is a catch-up that may retry with backoff for seconds, so every other
// projection — and every reader of the store — would wait for it. Measured
// (TestHandlerDoesNotHoldTheHorizon, a handler holding a trigger for 3 s while an event is
// appended): with FOR UPDATE the event became readable after 3.0 s, when the trigger was acked;
// without it after 1 ms, while the handler still held the trigger.
//
// So the subscriptions' SELECT has no FOR UPDATE (the adapter strips it, and refuses to run
// if a watermill-sql upgrade changes that SELECT's shape). The transaction takes an id only for
// the ack's DELETE, just before its commit. Subscriptions also run at READ COMMITTED instead
// of the queue schema's REPEATABLE READ: a DELETE of rows that another consumer already
// deleted then affects nothing, where REPEATABLE READ fails the ack with "could not serialize
// access due to concurrent delete" and stalls the subscription for RetryInterval. And the
// SELECT goes over pgx's simple protocol: with the extended protocol its finished portal keeps
// a snapshot until the transaction's next statement, so the idle transaction would hold back
// VACUUM (not the event store) while the handler runs. The test checks that the idle
// transaction shows neither backend_xid nor backend_xmin in pg_stat_activity.
//
// The consequence: two consumers of one projection (two workers) may both receive a trigger.
// That is harmless — triggers are idempotent nudges, and the projection runner serialises
// catch-ups on the projection's position row — and costs one no-op catch-up.
//
// # Latency: woken, not polled
//
// watermill-sql only polls. The channel adds the wake-up: a statement trigger on the queue
// table (migration channel/0003) sends one notification on postgres.NotifyTriggers per
// transaction that queues triggers, delivered when it commits; the channel LISTENs on a
// connection of its own (taken out of the pool, from the first subscription until Close) and
// wakes every subscription. A subscription that found nothing waits for that wake-up; a
// wake-up that comes while it polls ends its next wait at once, so none is lost. A trigger
// therefore arrives a notification's round trip after its commit instead of half a
// PollInterval later.
//
// A notification can still go missing (a trigger queued with the table's triggers disabled,
// by session_replication_role = replica, say), so while it listens the channel also polls —
// once for all its subscriptions: every ListeningPollInterval (10 s, ±10%) one statement looks
// for queued triggers of every projection subscribed through it and wakes the subscriptions of
// those that have some. The subscriptions do not poll on their own meanwhile, so an idle
// channel costs one statement per ListeningPollInterval however many projections it carries
// (it cost one poll per subscription per ListeningPollInterval before: 30 transactions/s for
// 300 projections).
//
// The wait happens in the subscriber's BackoffManager (watermill-sql's own sleep between polls
// cannot be woken). When the listening connection is lost the channel wakes every subscription
// and they poll every PollInterval until the listener has reconnected (with backoff; it wakes
// them again then, since notifications sent meanwhile were lost). DisableListen (or a database
// handle that is not a pool) keeps PollInterval polling throughout, as behind PgBouncer in
// transaction mode. Measured with polling only (BenchmarkPublishToConsume, publish → receive,
// at 20 and at 500 triggers/s alike; ranges over runs):
//
//	poll interval   p50          p99
//	10 ms           5–9 ms       12–31 ms
//	100 ms          49–52 ms     100–106 ms   (the default)
//	1 s             510–590 ms   960–995 ms
//
// and the idle cost of polling (BenchmarkIdlePolling; CPU in % of one core, in this process and
// in the PostgreSQL backends; /proc ticks make the PostgreSQL figures ±0.3%):
//
//	poll interval   subscriptions   polls/s    CPU here       CPU in PostgreSQL
//	10 ms           1 / 10          90 / 830   7% / 15–18%    4% / 19–20%
//	50 ms           1 / 10          19 / 189   1.5% / 6%      0.7% / 4.7%
//	100 ms          1 / 10          10 / 97    1.2% / 3.6%    0.7% / 1.7–2%
//	1 s             1 / 10          1 / 10     0.2% / 0.5%    below 0.3%
//
// make bench measures the woken channel beside these (docs/performance.md).
//
// # Nacks, AckDeadline and connections
//
// A nacked trigger is delivered again after ResendInterval, by the same subscriber, in the
// same transaction (no row is unlocked or rewritten; the transaction holds no id meanwhile).
// The projection's Retry middleware should retry before that, so a nack means "give up for
// now".
//
// AckDeadline bounds how long a handler may hold a trigger: when it passes, the message's
// context is cancelled — which also ends the Retry middleware's backoff (it returns
// context.DeadlineExceeded, which the poison step must not dead-letter) — and the trigger is
// delivered again on the next poll. Keep the retry budget (MaxElapsedTime plus one catch-up)
// well below AckDeadline. Triggers read in the same batch after an abandoned one are delivered
// again too: watermill-sql v4.0.0 alone would delete them undelivered, so the channel's ack
// deletes only the rows up to the last acked one.
//
// A subscription holds one pooled connection for as long as its handler runs. Give the channel
// a pool with more connections than projections consuming at once, plus what the handlers
// themselves take if they share it; otherwise handlers waiting for a connection stall until
// AckDeadline. The channel logs a warning when its subscriptions reach the pool's size.
//
// # Append overhead
//
// Publishing the trigger in the append's transaction adds one INSERT to it. Measured
// (BenchmarkAppend, 10 events per append, one goroutine, 2 cores shared with other work; the
// median and, in brackets, the best of 10 runs of one invocation): an append alone 0.68 ms
// (0.55), with PublishTx to 1 declared projection 0.82 ms (0.71), to 10 projections 1.12 ms
// (0.82): about +0.15–0.3 ms for the one more round trip, and +0.1–0.3 ms more for ten rows.
// Appends that come in bursts can share one trigger: a trigger says "look", not what to read.
// Since the queue wakes its subscriptions with NOTIFY, such an append also notifies in its
// transaction, and PostgreSQL makes the commits of notifying transactions take turns (WAL
// flush included): concurrent appenders lose more of their throughput to it than the relay,
// which queues one trigger per batch, costs them (make bench, append scenario).
package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/channel"
	"github.com/nudgeworks/nudge/internal/tracing"
	"github.com/nudgeworks/nudge/name"
	"github.com/nudgeworks/nudge/postgres"
	"github.com/nudgeworks/nudge/trigger"
)

// Defaults of Config's fields.
const (
	// PollIntervalDefault is how long an idle subscription waits between polls of its queue
	// while the channel does not listen. It then bounds the latency of a trigger; see the
	// package documentation for the measured latency and idle cost.
	PollIntervalDefault = 100 * time.Millisecond
	// AckDeadlineDefault is how long a handler may hold a trigger before it is redelivered.
	AckDeadlineDefault = 30 * time.Second
	// ResendIntervalDefault is how long a subscription waits before it resends a nacked
	// trigger.
	ResendIntervalDefault = time.Second
	// RetryIntervalDefault is how long a subscription waits after a failed poll (database
	// down) before it polls again.
	RetryIntervalDefault = time.Second
	// BatchSizeDefault is how many queued triggers a subscription reads per poll.
	BatchSizeDefault = 100
	// ListeningPollIntervalDefault is how often the channel polls the queues of all its
	// subscriptions, in one statement, while its listener listens: the poll is then only a
	// fallback for a lost notification.
	ListeningPollIntervalDefault = 10 * time.Second
)

// Config configures a Channel. The zero value is valid.
type Config struct {
	// Schema holds the channel's tables. Defaults to "", which means the connection's
	// search_path (usually public). A schema name is lowercase letters, digits and _.
	Schema string
	// PollInterval is how long an idle subscription waits before it looks for triggers again
	// while the channel does not listen for notifications (DisableListen, a database handle
	// that is not a pool, or while the listening connection is lost); a trigger then waits on
	// average half of it. Defaults to PollIntervalDefault.
	PollInterval time.Duration
	// ListeningPollInterval is how often, while the channel listens, one statement looks for
	// triggers queued for any of its subscriptions and wakes those that have some: the
	// fallback for a notification that never came. The subscriptions themselves then do not
	// poll; a notification wakes them at once. Each wait is jittered by ±10%. Defaults to
	// ListeningPollIntervalDefault, or PollInterval if that is longer.
	ListeningPollInterval time.Duration
	// DisableListen turns the listener off: subscriptions poll every PollInterval, as they
	// must behind a connection pooler in transaction mode (PgBouncer), where LISTEN does not
	// work.
	DisableListen bool
	// ListenConnect opens the connection the listener LISTENs on. It must reach PostgreSQL
	// directly, not through a pooler in transaction mode: postgres.PoolConnect(directPool), or
	// a pgx.Connect to a direct URL. Defaults to a connection taken from New's pool for good.
	ListenConnect postgres.ConnectFunc
	// TransactionPooling says that New's database handle goes through a connection pooler in
	// transaction mode (PgBouncer's pool_mode = transaction). New then refuses, with an error
	// matching postgres.ErrSessionNeeded, a pool that prepares named statements per
	// connection (pgx's default), and listening on that pool: set ListenConnect or
	// DisableListen.
	TransactionPooling bool
	// ListenerConfig tunes the listener's reconnection; its Channel and Logger are the
	// channel's own.
	ListenerConfig postgres.ListenerConfig
	// AckDeadline is how long a handler may hold a trigger. When it passes, the message's
	// context is cancelled (which ends the Retry middleware's backoff) and the trigger is
	// delivered again. Keep a handler's whole retry budget well below it. Defaults to
	// AckDeadlineDefault.
	AckDeadline time.Duration
	// ResendInterval is how long a subscription waits before it delivers a nacked trigger
	// again. Defaults to ResendIntervalDefault.
	ResendInterval time.Duration
	// RetryInterval is how long a subscription waits after a failed poll before the next one.
	// Defaults to RetryIntervalDefault.
	RetryInterval time.Duration
	// BatchSize is how many triggers a subscription reads per poll. The rows of a batch are
	// deleted together once the last of them is acked. Defaults to BatchSizeDefault.
	BatchSize int
	// Logger receives the subscriptions' logs (through Watermill's slog adapter), each line
	// with its projection. Defaults to a logger that discards everything.
	Logger *slog.Logger

	// lockRows keeps the queue schema's SELECT … FOR UPDATE. Tests only: it shows what the
	// row locks would cost (see TestHandlerDoesNotHoldTheHorizon).
	lockRows bool
	// waitingFunc, if set, is called each time a subscription starts to wait after a poll
	// that found nothing, with whether the listener listens. Tests only.
	waitingFunc func(listening bool)
	// sweptFunc, if set, is called after each sweep (the fallback poll while listening) with
	// the projections it found triggers queued for. Tests only.
	sweptFunc func(woken []string)
}

// Errors callers can test for.
var (
	// ErrInvalidConfig matches a Config that New refuses.
	ErrInvalidConfig = errors.New("postgres channel: invalid config")
	// ErrNotMigrated matches a call that found the channel's tables missing.
	ErrNotMigrated = errors.New("postgres channel: the channel's tables do not exist")
	// ErrNotDeclared matches a trigger addressed to a projection that no process has declared.
	ErrNotDeclared = errors.New("postgres channel: projection not declared")
	// ErrClosed matches a call on a closed Channel.
	ErrClosed = errors.New("postgres channel: closed")
)

// WithDefaults returns cfg with every zero field that has a default set to it.
func (cfg Config) WithDefaults() Config {
	cfg.PollInterval = cmp.Or(cfg.PollInterval, PollIntervalDefault)
	cfg.ListeningPollInterval = cmp.Or(cfg.ListeningPollInterval, max(ListeningPollIntervalDefault, cfg.PollInterval))
	cfg.AckDeadline = cmp.Or(cfg.AckDeadline, AckDeadlineDefault)
	cfg.ResendInterval = cmp.Or(cfg.ResendInterval, ResendIntervalDefault)
	cfg.RetryInterval = cmp.Or(cfg.RetryInterval, RetryIntervalDefault)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, BatchSizeDefault)
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	return cfg
}

// Validate reports what is wrong with cfg (after WithDefaults), as an error matching
// ErrInvalidConfig.
func (cfg Config) Validate() error {
	if err := postgres.ValidateSchema(cfg.Schema); err != nil {
		return fmt.Errorf("%w: Schema: %w", ErrInvalidConfig, err)
	}
	for _, d := range []struct {
		field string
		value time.Duration
	}{{"PollInterval", cfg.PollInterval}, {"ListeningPollInterval", cfg.ListeningPollInterval}, {"AckDeadline", cfg.AckDeadline}, {"ResendInterval", cfg.ResendInterval}, {"RetryInterval", cfg.RetryInterval}} {
		if d.value <= 0 {
			return fmt.Errorf("%w: %s %v: must be positive (0 means the default)", ErrInvalidConfig, d.field, d.value)
		}
	}
	if cfg.BatchSize < 1 {
		return fmt.Errorf("%w: BatchSize %d: must be 1 or more (0 means %d)", ErrInvalidConfig, cfg.BatchSize, BatchSizeDefault)
	}
	return nil
}

// Channel is the PostgreSQL channel. It is safe for concurrent use.
type Channel struct {
	db      postgres.DB
	cfg     Config
	tables  tables
	schema  *schemaAdapter
	offsets offsetsAdapter
	pub     *wmsql.Publisher
	log     *slog.Logger
	wmLog   watermill.LoggerAdapter

	migrated atomic.Bool
	closed   atomic.Bool

	// listener wakes the subscriptions on queued triggers; nil when the channel only polls.
	// It runs from the first subscription until Close.
	listener *postgres.Listener
	// sweep is the subscriptions' one fallback poll while the listener listens; it runs with
	// the listener.
	sweep      *sweep
	listenOnce sync.Once
	stopListen context.CancelFunc
	listenDone chan struct{}

	mu   sync.Mutex
	subs []*subscriber
}

var (
	_ channel.Channel    = (*Channel)(nil)
	_ channel.Undeclarer = (*Channel)(nil)
)

// New returns a channel on db, which must be a pool (a *pgxpool.Pool), not a single
// connection: the channel runs concurrent subscriptions on it. New does not touch the
// database: Declare (or Migrate) creates the tables.
func New(db postgres.DB, cfg Config) (*Channel, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: New needs a database handle (a *pgxpool.Pool), got nil", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	c := &Channel{db: db, cfg: cfg, tables: newTables(cfg.Schema), log: log, wmLog: watermill.NewSlogLogger(log)}
	c.schema = newSchemaAdapter(c.tables, cfg.BatchSize, cfg.lockRows)
	c.offsets = newOffsetsAdapter(c.tables)
	pub, err := wmsql.NewPublisher(wmsql.BeginnerFromPgx(db), wmsql.PublisherConfig{SchemaAdapter: c.schema}, c.wmLog)
	if err != nil {
		return nil, fmt.Errorf("postgres channel: %w", err)
	}
	c.pub = pub
	connect, err := listenConnect(db, cfg)
	if err != nil {
		return nil, err
	}
	if connect != nil {
		lcfg := cfg.ListenerConfig
		lcfg.Channel, lcfg.Logger = postgres.NotifyTriggers, log
		if c.listener, err = postgres.NewListener(connect, lcfg); err != nil {
			return nil, fmt.Errorf("%w: ListenerConfig: %w", ErrInvalidConfig, err)
		}
		c.sweep = newSweep()
	}
	return c, nil
}

// listenConnect returns what opens the listener's connection, or nil when the channel polls
// only; behind a pooler in transaction mode it refuses what needs a session.
func listenConnect(db postgres.DB, cfg Config) (postgres.ConnectFunc, error) {
	if cfg.TransactionPooling {
		if err := postgres.CheckTransactionPooling(db); err != nil {
			return nil, fmt.Errorf("%w: TransactionPooling: %w", ErrInvalidConfig, err)
		}
	}
	switch {
	case cfg.DisableListen:
		return nil, nil
	case cfg.ListenConnect != nil:
		return cfg.ListenConnect, nil
	case cfg.TransactionPooling:
		return nil, fmt.Errorf("%w: TransactionPooling: %w: the channel LISTENs for queued triggers on a connection of its own: "+
			"set ListenConnect to a direct connection (postgres.PoolConnect(directPool)), or DisableListen to poll only",
			ErrInvalidConfig, postgres.ErrSessionNeeded)
	}
	if pool, ok := db.(interface {
		Acquire(ctx context.Context) (*pgxpool.Conn, error)
	}); ok {
		return postgres.PoolConnect(pool), nil
	}
	return nil, nil
}

// startListener starts the listener and the sweep, once.
func (c *Channel) startListener() {
	c.listenOnce.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		c.stopListen, c.listenDone = cancel, make(chan struct{})
		go func() {
			defer close(c.listenDone)
			var wg sync.WaitGroup
			wg.Go(func() { c.runSweep(ctx) })
			_ = c.listener.Run(ctx) // returns nil when ctx ends; a second Run cannot happen
			wg.Wait()
		}()
	})
}

// Listening reports whether the channel's listener is connected now, so a queued trigger
// wakes the subscriptions at once.
func (c *Channel) Listening() bool { return c.listener != nil && c.listener.Listening() }

// Migrate creates or upgrades the channel's tables alone: postgres.Migrate with
// postgres.ComponentQueue in the channel's schema (postgres.Migrate without components migrates
// every component's tables at once). Declare does it too; call Migrate in processes that only
// publish, or at deploy time. It is safe to run at every start and from several processes at
// once.
func (c *Channel) Migrate(ctx context.Context) error {
	if err := pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error { return c.MigrateTx(ctx, tx) }); err != nil {
		return err
	}
	c.migrated.Store(true)
	return nil
}

// MigrateTx is Migrate inside the caller's transaction.
func (c *Channel) MigrateTx(ctx context.Context, tx pgx.Tx) error {
	if err := postgres.MigrateTx(ctx, tx, c.cfg.Schema, postgres.ComponentQueue); err != nil {
		return fmt.Errorf("postgres channel: %w", err)
	}
	return nil
}

// Declare implements channel.Channel: it creates the channel's tables if needed and registers
// the projections, so every trigger published from then on — by any process on this database
// — gets a row for each of them. It is idempotent.
func (c *Channel) Declare(ctx context.Context, projections ...string) error {
	for _, projection := range projections {
		if err := name.Validate(projection); err != nil {
			return err
		}
	}
	if c.closed.Load() {
		return ErrClosed
	}
	migrating := !c.migrated.Load()
	err := pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error {
		if migrating {
			if err := c.MigrateTx(ctx, tx); err != nil {
				return err
			}
		}
		if len(projections) == 0 {
			return nil
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+c.tables.subscriptions+` (projection) SELECT unnest($1::text[])
			ON CONFLICT (projection) DO NOTHING`, projections)
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres channel: declare %v: %w", projections, c.translate(err))
	}
	if migrating {
		c.migrated.Store(true)
	}
	c.log.Debug("postgres channel: declared projections", slog.Any("projections", projections))
	return nil
}

// Undeclare removes projections from the registry and deletes their queued triggers: use it
// when a projection is deleted, so publishers stop queueing triggers nobody will read. A
// process that still consumes such a projection gets no more triggers until it declares it
// again.
func (c *Channel) Undeclare(ctx context.Context, projections ...string) error {
	for _, projection := range projections {
		if err := name.Validate(projection); err != nil {
			return err
		}
	}
	if c.closed.Load() {
		return ErrClosed
	}
	err := pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM `+c.tables.subscriptions+` WHERE projection = ANY($1::text[])`, projections); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM `+c.tables.triggers+` WHERE projection = ANY($1::text[])`, projections)
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres channel: undeclare %v: %w", projections, c.translate(err))
	}
	return nil
}

// Publish implements channel.Channel: one statement inserts a row for every projection
// declared on the database (or, when t.Projection is set, for that one; a projection nobody
// declared is refused with ErrNotDeclared).
func (c *Channel) Publish(ctx context.Context, t trigger.Trigger) error {
	if c.closed.Load() {
		return ErrClosed
	}
	topic, msg, err := c.triggerMessage(ctx, c.db, t)
	if err != nil {
		return err
	}
	if err := c.pub.Publish(topic, msg); err != nil {
		return fmt.Errorf("postgres channel: publish trigger: %w", c.translate(err))
	}
	return nil
}

// PublishTx is Publish inside the caller's transaction, through watermill-sql's publisher on
// that transaction: the trigger rows commit or roll back with tx. Publish the trigger of an
// append in the append's transaction and every projection gets it exactly when the events
// commit, even if the process dies right after the commit.
//
// The fan-out reads the registry with tx's snapshot: at READ COMMITTED (pgx's default) that is
// the registry when PublishTx runs.
func (c *Channel) PublishTx(ctx context.Context, tx pgx.Tx, t trigger.Trigger) error {
	if tx == nil {
		return errors.New("postgres channel: PublishTx needs a transaction, got nil; use Publish to publish in a transaction of the channel's own")
	}
	if c.closed.Load() {
		return ErrClosed
	}
	topic, msg, err := c.triggerMessage(ctx, tx, t)
	if err != nil {
		return err
	}
	// A publisher is a small struct; a new one per transaction is what watermill-sql expects
	// (AutoInitializeSchema stays off: it is refused on a transaction).
	pub, err := wmsql.NewPublisher(wmsql.TxFromPgx(tx), wmsql.PublisherConfig{SchemaAdapter: c.schema}, c.wmLog)
	if err != nil {
		return fmt.Errorf("postgres channel: %w", err)
	}
	if err := pub.Publish(topic, msg); err != nil {
		return fmt.Errorf("postgres channel: publish trigger in transaction: %w", c.translate(err))
	}
	return nil
}

// triggerMessage encodes t and picks its topic; a trigger addressed to a projection must name
// a declared one.
func (c *Channel) triggerMessage(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, t trigger.Trigger) (string, *message.Message, error) {
	topic := channel.TriggerTopic
	if t.Projection != "" {
		if err := name.Validate(t.Projection); err != nil {
			return "", nil, err
		}
		var declared bool
		if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+c.tables.subscriptions+` WHERE projection = $1)`, t.Projection).Scan(&declared); err != nil {
			return "", nil, fmt.Errorf("postgres channel: publish trigger: %w", c.translate(err))
		}
		if !declared {
			return "", nil, fmt.Errorf("%w: %q: no process has declared it on this database, so nothing would consume the trigger; call Declare(ctx, %q) first",
				ErrNotDeclared, t.Projection, t.Projection)
		}
		topic = projectionTopic(t.Projection)
	}
	msg, err := trigger.NewMessage(t)
	if err != nil {
		return "", nil, err
	}
	msg.SetContext(ctx)
	tracing.Inject(ctx, msg.Metadata) // the consumer's span is a child of ctx's
	return topic, msg, nil
}

// Declared reports whether a process has declared the projection on this database, so that a
// trigger addressed to it would be consumed. Without the channel's tables it returns an error
// matching ErrNotMigrated.
func (c *Channel) Declared(ctx context.Context, projection string) (bool, error) {
	if err := name.Validate(projection); err != nil {
		return false, err
	}
	if c.closed.Load() {
		return false, ErrClosed
	}
	var declared bool
	if err := c.db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+c.tables.subscriptions+` WHERE projection = $1)`, projection).Scan(&declared); err != nil {
		return false, fmt.Errorf("postgres channel: look up projection %s: %w", projection, c.translate(err))
	}
	return declared, nil
}

// Subscriber implements channel.Channel. Each call returns a new subscriber (a Watermill
// router closes a handler's subscriber when it stops); Close closes them all. Declare the
// projection before triggers are published: the subscription only receives triggers
// published while the projection is declared.
func (c *Channel) Subscriber(projection string) (message.Subscriber, string, error) {
	if err := name.Validate(projection); err != nil {
		return nil, "", err
	}
	sub, err := c.newSubscriber(slog.String("projection", projection))
	if err != nil {
		return nil, "", err
	}
	return sub, projectionTopic(projection), nil
}

func (c *Channel) newSubscriber(attr slog.Attr) (*subscriber, error) {
	ackDeadline := c.cfg.AckDeadline
	log := c.log.With(attr)
	wake := &wakeBackoff{errs: wmsql.NewDefaultBackoffManager(c.cfg.PollInterval, c.cfg.RetryInterval),
		listening: func() bool { return false }, poll: c.cfg.PollInterval, longish: c.cfg.ListeningPollInterval,
		waitingFunc: c.cfg.waitingFunc, nudged: make(chan struct{}, 1)}
	s := &subscriber{done: make(chan struct{}), unsubscribe: func() {}, wake: wake}
	wake.done = s.done
	wsub, err := wmsql.NewSubscriber(wmsql.BeginnerFromPgx(c.db), wmsql.SubscriberConfig{
		AckDeadline:    &ackDeadline,
		PollInterval:   c.cfg.PollInterval,
		ResendInterval: c.cfg.ResendInterval,
		RetryInterval:  c.cfg.RetryInterval,
		BackoffManager: wake,
		SchemaAdapter:  c.schema,
		OffsetsAdapter: c.offsets,
	}, watermill.NewSlogLogger(log))
	if err != nil {
		return nil, fmt.Errorf("postgres channel: %w", err)
	}
	s.Subscriber = wsub
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return nil, ErrClosed
	}
	if c.listener != nil {
		c.startListener()
		wake.woken, s.unsubscribe = c.listener.Subscribe()
		wake.listening = c.listener.Listening
		s.sweep = c.sweep
	}
	c.subs = append(c.subs, s)
	if pool, ok := c.db.(interface{ Stat() *pgxpool.Stat }); ok {
		if maxConns := int(pool.Stat().MaxConns()); len(c.subs) >= maxConns {
			log.Warn("postgres channel: as many subscriptions as the pool has connections; a subscription holds a connection while its handler runs, so handlers that need one can stall until AckDeadline: give the channel a larger pool",
				slog.Int("subscriptions", len(c.subs)), slog.Int("pool_max_conns", maxConns))
		}
	}
	return s, nil
}

// Publisher implements channel.Channel. It publishes raw messages to channel.TriggerTopic
// (every declared projection), to a projection's topic (Subscriber returns it; the message is
// dropped if the projection is not declared); payloads may be any bytes. Its Close does nothing: Channel.Close ends it, so a router that closes its
// handlers' publishers cannot close the channel under its other users.
func (c *Channel) Publisher() message.Publisher { return publisher{c} }

type publisher struct{ c *Channel }

func (p publisher) Publish(topic string, msgs ...*message.Message) error {
	if p.c.closed.Load() {
		return ErrClosed
	}
	if err := p.c.pub.Publish(topic, msgs...); err != nil {
		return fmt.Errorf("postgres channel: publish to %s: %w", topic, p.c.translate(err))
	}
	return nil
}

func (publisher) Close() error { return nil }

// Durable implements channel.Channel: triggers wait in PostgreSQL until a consumer acks them.
func (c *Channel) Durable() bool { return true }

// Close implements channel.Channel: it stops every subscription the channel made (each
// returns once its current delivery is acked, nacked or abandoned). It does not close db.
func (c *Channel) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	c.mu.Lock()
	subs := c.subs
	c.subs = nil
	c.mu.Unlock()
	// The shared publisher is not closed: watermill-sql's Publisher.Close is only a wait for
	// publishes in flight and races with them; the closed flag already refuses new ones.
	var errs []error
	for _, sub := range subs {
		errs = append(errs, sub.Close())
	}
	c.mu.Lock()
	stopListen, listenDone := c.stopListen, c.listenDone
	c.mu.Unlock()
	if stopListen != nil {
		stopListen()
		<-listenDone
	}
	return errors.Join(errs...)
}

// Schema returns the schema the channel's tables are in ("" for the search path).
func (c *Channel) Schema() string { return c.cfg.Schema }

// translate explains the errors a user can cause; others pass through.
func (c *Channel) translate(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		where := "the search_path"
		if c.cfg.Schema != "" {
			where = "schema " + c.cfg.Schema
		}
		return fmt.Errorf("%w in %s: call Declare (or Migrate) once at start-up: %w", ErrNotMigrated, where, err)
	}
	return err
}
