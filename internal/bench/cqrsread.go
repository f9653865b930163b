package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/cqrs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
)

// The read model both sides of the cqrs scenario write: one row per applied event, as a
// history or an activity feed would keep it. It has no unique key on purpose: a handler that
// applies an event twice leaves two rows, so duplicates are counted from the table, and an
// event of the store without a row is lost.
const (
	activityName     = "ticket_activity"
	activityDDL      = `CREATE TABLE IF NOT EXISTS %s (event_id uuid NOT NULL, stream text NOT NULL, version bigint NOT NULL)`
	activityInsert   = `INSERT INTO %s (event_id, stream, version) VALUES ($1, $2, $3)`
	cqrsHandlerName  = "ticket_activity"
	cqrsSQLTopic     = "ticket_events"
	cqrsCloseTimeout = 10 * time.Second
	// cqrsPublishChannels is the RabbitMQ publisher's channel pool: one per writer, so that
	// publishes neither open a channel each nor wait for each other's confirms.
	cqrsPublishChannels = 8
)

// activityProjection is the nudge projection of the read model: a per-event On handler that
// inserts one row through the batch's transaction (the flush hook is optional).
func activityProjection(name string, onFailure projection.OnFailure, hooks liveHooks) (*projection.Projection, error) {
	table := pgx.Identifier{name}.Sanitize()
	insert := fmt.Sprintf(activityInsert, table)
	return projection.New(name, projection.Config{
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, fmt.Sprintf(activityDDL, table))
			return err
		},
		FlushFunc: hooks.flush,
		OnFailure: onFailure,
	}, projection.On("TicketWasUpdated", func(ctx context.Context, tx pgx.Tx, e projection.Event[livePayload]) error {
		if err := hooks.see(name, e.Event); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, insert, e.ID, e.StreamID, e.StreamVersion)
		return err
	}))
}

// TicketWasUpdated is the event as Watermill's CQRS event bus publishes it after the event
// store committed it: the store's event id, stream and version ride along so the handler can
// write the same read model.
type TicketWasUpdated struct {
	EventID  uuid.UUID `json:"event_id"`
	StreamID string    `json:"stream_id"`
	Version  int64     `json:"version"`
}

// cqrsBroker is the Watermill wiring of the CQRS side on one broker: RabbitMQ (a durable
// queue on a fanout exchange, publisher confirms) or watermill-sql's PostgreSQL queue
// schema (polled every -pg-poll, like nudge's PostgreSQL channel), each as its
// documentation sets it up.
type cqrsBroker struct {
	kind  string
	topic string
	pub   message.Publisher
	sub   message.Subscriber
}

// cqrsSpec is what a CQRS or nudge consumer needs to find its broker, database and topics;
// the parent passes it to consumers in child processes as JSON.
type cqrsSpec struct {
	System      string        `json:"system"` // "cqrs" or "nudge"
	Broker      string        `json:"broker"` // chAMQP or chPostgres
	DatabaseURL string        `json:"database_url"`
	AMQPURL     string        `json:"amqp_url"`
	Prefix      string        `json:"prefix"` // RabbitMQ names
	PGPoll      time.Duration `json:"pg_poll"`
	Table       string        `json:"table"`
	// KillAt makes the consumer SIGKILL itself after it has written its KillAt-th event, before
	// the ack; 0: never.
	KillAt int `json:"kill_at"`
}

const (
	systemCQRS  = "cqrs"
	systemNudge = "nudge"
)

// openCQRSBroker opens the publisher and the subscriber of spec's broker. pool is used for
// the PostgreSQL queue.
func openCQRSBroker(spec cqrsSpec, pool *pgxpool.Pool, log watermill.LoggerAdapter) (*cqrsBroker, error) {
	b := &cqrsBroker{kind: spec.Broker}
	var err error
	switch spec.Broker {
	case chAMQP:
		b.topic = spec.Prefix + "events"
		cfg := amqp.NewDurablePubSubConfig(spec.AMQPURL, amqp.GenerateQueueNameTopicNameWithSuffix(cqrsHandlerName))
		cfg.Publish.ConfirmDelivery = true // as nudge's channel: a publish returns once the broker has it
		cfg.Publish.ChannelPoolSize = cqrsPublishChannels
		if b.pub, err = amqp.NewPublisher(cfg, log); err != nil {
			return nil, err
		}
		if b.sub, err = amqp.NewSubscriber(cfg, log); err != nil {
			_ = b.pub.Close()
			return nil, err
		}
	case chPostgres:
		b.topic = cqrsSQLTopic
		if b.pub, err = wmsql.NewPublisher(wmsql.BeginnerFromPgx(pool), wmsql.PublisherConfig{
			SchemaAdapter: wmsql.PostgreSQLQueueSchema{}, AutoInitializeSchema: true,
		}, log); err != nil {
			return nil, err
		}
		if b.sub, err = wmsql.NewSubscriber(wmsql.BeginnerFromPgx(pool), wmsql.SubscriberConfig{
			SchemaAdapter: wmsql.PostgreSQLQueueSchema{}, OffsetsAdapter: wmsql.PostgreSQLQueueOffsetsAdapter{},
			InitializeSchema: true, PollInterval: spec.PGPoll,
		}, log); err != nil {
			_ = b.pub.Close()
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown broker %q", spec.Broker)
	}
	return b, nil
}

// declare creates the handler's queue (RabbitMQ) or table (PostgreSQL), so that events
// published before a consumer runs wait for it.
func (b *cqrsBroker) declare() error {
	init, ok := b.sub.(message.SubscribeInitializer)
	if !ok {
		return fmt.Errorf("the %s subscriber cannot declare its topic", b.kind)
	}
	return init.SubscribeInitialize(b.topic)
}

func (b *cqrsBroker) close() error { return errors.Join(b.sub.Close(), b.pub.Close()) }

// eventBus returns the CQRS event bus publishing to b.
func (b *cqrsBroker) eventBus() (*cqrs.EventBus, error) {
	return cqrs.NewEventBusWithConfig(b.pub, cqrs.EventBusConfig{
		GeneratePublishTopic: func(cqrs.GenerateEventPublishTopicParams) (string, error) { return b.topic, nil },
		Marshaler:            cqrs.JSONMarshaler{},
	})
}

// runCQRSProcessor runs a router with a cqrs.EventProcessor whose one handler applies each
// event with handle, until ctx ends. It returns once the router runs; wait returns its end.
func runCQRSProcessor(ctx context.Context, b *cqrsBroker, log watermill.LoggerAdapter, handle func(ctx context.Context, e *TicketWasUpdated) error) (wait func() error, err error) {
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: cqrsCloseTimeout}, log)
	if err != nil {
		return nil, err
	}
	ep, err := cqrs.NewEventProcessorWithConfig(router, cqrs.EventProcessorConfig{
		GenerateSubscribeTopic: func(cqrs.EventProcessorGenerateSubscribeTopicParams) (string, error) { return b.topic, nil },
		SubscriberConstructor: func(cqrs.EventProcessorSubscriberConstructorParams) (message.Subscriber, error) {
			return b.sub, nil
		},
		Marshaler: cqrs.JSONMarshaler{},
		Logger:    log,
	})
	if err != nil {
		return nil, err
	}
	if err := ep.AddHandlers(cqrs.NewEventHandler(cqrsHandlerName, handle)); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	select {
	case <-router.Running():
		return func() error { return <-done }, nil
	case err := <-done:
		return nil, fmt.Errorf("the CQRS router stopped at start: %w", err)
	case <-time.After(setupTimeout):
		return nil, fmt.Errorf("the CQRS router did not start within %s", setupTimeout)
	}
}

// cqrsApplier is the CQRS handler: it inserts the event's row in a transaction of its own (a
// single autocommitted statement), and notes when it committed.
type cqrsApplier struct {
	pool   *pgxpool.Pool
	insert string

	mu      sync.Mutex
	visible map[uuid.UUID]time.Time
}

func newCQRSApplier(pool *pgxpool.Pool, table string) *cqrsApplier {
	return &cqrsApplier{pool: pool, insert: fmt.Sprintf(activityInsert, pgx.Identifier{table}.Sanitize()), visible: map[uuid.UUID]time.Time{}}
}

func (a *cqrsApplier) apply(ctx context.Context, e *TicketWasUpdated) error {
	if _, err := a.pool.Exec(ctx, a.insert, e.EventID, e.StreamID, e.Version); err != nil {
		return err
	}
	now := time.Now()
	a.mu.Lock()
	if _, ok := a.visible[e.EventID]; !ok {
		a.visible[e.EventID] = now
	}
	a.mu.Unlock()
	return nil
}

// saveThenPublish is the command side of a CQRS service: it appends the event to the store
// (committed) and then publishes it on the event bus. failPublish, if set, makes the publish
// after the commit fail for the events it picks, as a broker outage or a crash between the
// two steps would: the append stands, the event is never published, and the command side
// carries on (the caller sees an error and the event is in the store).
type saveThenPublish struct {
	store       appender
	bus         *cqrs.EventBus
	failPublish func() bool
	log         *slog.Logger

	mu        sync.Mutex
	committed map[uuid.UUID]time.Time
	failed    []uuid.UUID
}

// Append implements the store interface appendPaced writes through.
func (s *saveThenPublish) Append(ctx context.Context, streamID string, expected eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error) {
	res, err := s.store.Append(ctx, streamID, expected, events...)
	if err != nil {
		return res, err
	}
	at := time.Now()
	e := res.Events[0]
	s.mu.Lock()
	s.committed[e.ID] = at
	s.mu.Unlock()
	if s.failPublish != nil && s.failPublish() {
		s.mu.Lock()
		s.failed = append(s.failed, e.ID)
		s.mu.Unlock()
		s.log.Debug("cqrs: publish after the commit failed (injected)", slog.String("event_id", e.ID.String()))
		return res, nil
	}
	if err := s.bus.Publish(ctx, &TicketWasUpdated{EventID: e.ID, StreamID: e.StreamID, Version: e.StreamVersion}); err != nil {
		return res, fmt.Errorf("publish after the commit: %w", err)
	}
	return res, nil
}

// forget drops the commit times recorded so far: latencies counts only later appends.
func (s *saveThenPublish) forget() {
	s.mu.Lock()
	clear(s.committed)
	s.mu.Unlock()
}

// appender appends to one stream: the event store, or a command side in front of it.
type appender interface {
	Append(ctx context.Context, streamID string, expected eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error)
}

func newSaveThenPublish(store appender, bus *cqrs.EventBus, log *slog.Logger) *saveThenPublish {
	return &saveThenPublish{store: store, bus: bus, log: log, committed: map[uuid.UUID]time.Time{}}
}
