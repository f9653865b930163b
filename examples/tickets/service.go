package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nudgeworks/nudge"
	"github.com/nudgeworks/nudge/channel"
	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	pgchannel "github.com/nudgeworks/nudge/channel/postgres"
	"github.com/nudgeworks/nudge/metrics"
)

// Pool sizes, unless the database URL sets pool_max_conns.
const (
	// poolMaxConns serves HTTP requests, catch-ups (one per projection at a time), the relay
	// and dead-letter writes.
	poolMaxConns = 10
	// channelPoolMaxConns serves the PostgreSQL channel: each subscription holds a connection
	// while its handler runs, so it gets a pool of its own and never starves the catch-ups.
	channelPoolMaxConns = 4
)

// connectTimeout bounds each connection attempt, unless the database URL sets connect_timeout.
const connectTimeout = 10 * time.Second

// service is one process of the tickets service: its pools, its trigger channel and the nudge
// client built on them.
type service struct {
	cfg      Config
	log      *slog.Logger
	pool     *pgxpool.Pool
	chPool   *pgxpool.Pool   // PostgreSQL channel only
	ch       channel.Channel // nil in an API process until a replay needs it (see triggerChannel)
	chMu     sync.Mutex      // guards ch and chPool after open
	client   *nudge.Client
	models   readModels
	commands *tickets
	registry *prometheus.Registry // the /metrics endpoint's
}

// open connects, builds the client and, in every mode, migrates every table (event store,
// projection status, dead letters, channel) and prepares the projections: their init hooks
// create the read models the API serves, and their declared subscriptions keep every trigger
// published from now on, even while no worker runs yet (RabbitMQ drops what reaches an
// exchange without a bound queue). Nothing runs until run.
func open(ctx context.Context, cfg Config) (_ *service, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	log := cfg.Logger.With(slog.String("mode", string(cfg.Mode)))
	s := &service{cfg: cfg, log: log, models: newReadModels(cfg.Schema, cfg.TitleWidth, log), registry: prometheus.NewRegistry()}
	s.models.listVersion, s.models.listV2Hook = cfg.ListVersion, cfg.listV2Hook
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.pool, err = connect(ctx, cfg.DatabaseURL, poolMaxConns, cfg.Schema); err != nil {
		return nil, err
	}
	if cfg.Mode.RunsWorker() {
		// An API process appends and reads: it needs no broker, and starts while the broker
		// is down. Only a replay publishes from it (triggerChannel).
		if err := s.openChannel(ctx); err != nil {
			return nil, err
		}
	}
	if s.client, err = s.newClient(); err != nil {
		return nil, err
	}
	if err := s.client.Migrate(ctx); err != nil {
		return nil, fmt.Errorf("migrate nudge's tables: %w", err)
	}
	if err := s.client.Prepare(ctx); err != nil {
		return nil, err
	}
	s.commands = &tickets{client: s.client}
	return s, nil
}

// newClient wires nudge: the event store, projection status and dead letters in the pool's
// database, the projections, the relay that publishes their triggers on the channel, and
// Prometheus metrics of all of it on the /metrics endpoint's registry.
func (s *service) newClient() (*nudge.Client, error) {
	projections, err := s.models.projections()
	if err != nil {
		return nil, err
	}
	m, err := metrics.New(metrics.Config{Registerer: s.registry, Logger: s.log})
	if err != nil {
		return nil, err
	}
	return nudge.New(s.pool, nudge.Config{
		Channel: s.ch, Projections: projections, Schema: s.cfg.Schema, Logger: s.log, Metrics: m,
		Retry: s.cfg.Retry, SafetyNetInterval: s.cfg.SafetyNet, DisableReplayOnStart: s.cfg.DisableReplayOnStart,
		TracerProvider: s.cfg.TracerProvider,
	})
}

// triggerChannel returns the trigger channel, connecting it first in a process that has none
// yet (an API process, at its first replay).
func (s *service) triggerChannel(ctx context.Context) (channel.Channel, error) {
	s.chMu.Lock()
	defer s.chMu.Unlock()
	if s.ch == nil {
		if err := s.openChannel(ctx); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBrokerUnavailable, err)
		}
	}
	return s.ch, nil
}

// startupTimeout is how long a process in mode m retries its first connection to the broker:
// the channel's default in a worker, which needs the broker to do anything, and a few seconds
// in an API process, which connects in a request (a replay) and answers 503 if it cannot.
func startupTimeout(m Mode) time.Duration {
	if m.RunsWorker() {
		return 0
	}
	return apiBrokerTimeout
}

// apiBrokerTimeout bounds an API process's connection to the broker at its first replay.
const apiBrokerTimeout = 5 * time.Second

// openChannel connects the trigger channel. The client migrates its tables, if it has any.
func (s *service) openChannel(ctx context.Context) error {
	switch s.cfg.Channel {
	case ChannelAMQP:
		ch, err := amqpchannel.New(ctx, amqpchannel.Config{
			URL: s.cfg.AMQPURL, Prefix: s.cfg.AMQPPrefix, Logger: s.log,
			ConnectionName: s.cfg.AMQPPrefix + "tickets-" + string(s.cfg.Mode),
			StartupTimeout: startupTimeout(s.cfg.Mode),
		})
		if err != nil {
			return err
		}
		s.ch = ch
	case ChannelPostgres:
		var err error
		if s.chPool, err = connect(ctx, s.cfg.DatabaseURL, channelPoolMaxConns, s.cfg.Schema); err != nil {
			return err
		}
		ch, err := pgchannel.New(s.chPool, pgchannel.Config{Schema: s.cfg.Schema, PollInterval: s.cfg.PollInterval, Logger: s.log})
		if err != nil {
			return err
		}
		s.ch = ch
	}
	return nil
}

// run runs the client — the projections' handlers, the relay that publishes their triggers,
// the safety net, the replay after deploy — in the modes with a worker, until ctx ends or a
// part fails. An API process runs nothing in the background: it waits for ctx.
func (s *service) run(ctx context.Context) error {
	if !s.cfg.Mode.RunsWorker() {
		<-ctx.Done()
		return nil
	}
	return s.client.Run(ctx)
}

// close releases the channel and the pools.
func (s *service) close() {
	s.chMu.Lock()
	defer s.chMu.Unlock()
	if s.ch != nil {
		if err := s.ch.Close(); err != nil {
			s.log.Warn("closing the trigger channel failed", slog.Any("error", err))
		}
	}
	if s.chPool != nil {
		s.chPool.Close()
	}
	if s.pool != nil {
		s.pool.Close()
	}
}

// connect opens a pool on rawURL and checks that the server answers. Errors name the host,
// database and user, never the password. A schema (--schema) becomes the connections'
// search_path, unless the URL sets one: the versions of ticket_list create their tables and
// views, and find version 1's table, on the search path (see README.md).
func connect(ctx context.Context, rawURL string, maxConns int32, schema string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		var urlErr *url.Error
		if errors.As(err, &urlErr) {
			err = urlErr.Err // without the URL and its password
		}
		return nil, fmt.Errorf("%w: the database URL is not valid (%w); use postgres://user:password@host:5432/dbname",
			ErrInvalidConfig, err)
	}
	if !strings.Contains(rawURL, "pool_max_conns") {
		cfg.MaxConns = maxConns
	}
	if _, set := cfg.ConnConfig.RuntimeParams["search_path"]; schema != "" && !set {
		cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	where := fmt.Sprintf("%s (database %q, user %q)", net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))),
		cfg.ConnConfig.Database, cfg.ConnConfig.User)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("cannot reach PostgreSQL at %s: %w; check that it runs (make up) and --db or NUDGE_DATABASE_URL", where, err)
	}
	return pool, nil
}
