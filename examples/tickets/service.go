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

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nudgeworks/nudge/channel"
	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	pgchannel "github.com/nudgeworks/nudge/channel/postgres"
	dlpostgres "github.com/nudgeworks/nudge/deadletter/postgres"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/metrics"
	"github.com/nudgeworks/nudge/postgres"
	"github.com/nudgeworks/nudge/projection"
	pgprojection "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/worker"
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

// service is one process of the tickets service: what open connected and migrated, and the
// parts its mode runs.
type service struct {
	cfg      Config
	log      *slog.Logger
	pool     *pgxpool.Pool
	chPool   *pgxpool.Pool // PostgreSQL channel only
	store    *espg.Store
	backend  *pgprojection.Backend
	dead     *dlpostgres.Store
	ch       channel.Channel
	models   readModels
	runner   *projection.Runner
	relay    *relay.Relay     // modes all and api
	worker   *worker.Worker   // modes all and worker
	commands *tickets         // modes all and api
	metrics  *metrics.Metrics // the /metrics endpoint's (modes all and api)
	registry *prometheus.Registry
}

// open connects, migrates every table (event store, projection status, dead letters, channel),
// registers the projections (their init hooks create the read models) and declares their
// subscriptions, then builds the parts of cfg.Mode. Nothing runs until run.
func open(ctx context.Context, cfg Config) (_ *service, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &service{cfg: cfg, log: cfg.Logger.With(slog.String("mode", string(cfg.Mode)))}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.pool, err = connect(ctx, cfg.DatabaseURL, poolMaxConns); err != nil {
		return nil, err
	}
	if s.store, err = espg.New(s.pool, espg.Config{Schema: cfg.Schema}); err != nil {
		return nil, err
	}
	if s.backend, err = pgprojection.New(s.store); err != nil {
		return nil, err
	}
	if s.dead, err = dlpostgres.New(s.pool, dlpostgres.Config{Schema: cfg.Schema}); err != nil {
		return nil, err
	}
	// The channel's tables, if any, are migrated with the channel (openChannel).
	if err := postgres.Migrate(ctx, s.pool, cfg.Schema, postgres.ComponentEvents, postgres.ComponentProjections, postgres.ComponentDeadLetters); err != nil {
		return nil, fmt.Errorf("migrate the tables of the event store, projection status and dead letters: %w", err)
	}
	if err := s.openChannel(ctx); err != nil {
		return nil, err
	}

	s.models = newReadModels(cfg.Schema, cfg.TitleWidth, s.log)
	projections, err := s.models.projections()
	if err != nil {
		return nil, err
	}
	s.registry = prometheus.NewRegistry()
	if s.metrics, err = metrics.New(metrics.Config{Registerer: s.registry, Logger: s.log}); err != nil {
		return nil, err
	}
	runnerCfg := projection.RunnerConfig{Logger: s.log, OnBatch: s.metrics.ObserveBatch}
	if s.runner, err = projection.NewRunner(s.backend, runnerCfg, projections...); err != nil {
		return nil, err
	}
	// Every mode registers the projections: the API serves their read models and statuses.
	if err := s.runner.Init(ctx); err != nil {
		return nil, err
	}
	// Declared subscriptions keep every trigger published from now on, even while no worker
	// runs yet (RabbitMQ drops what reaches an exchange without a bound queue).
	if err := s.ch.Declare(ctx, s.runner.Names()...); err != nil {
		return nil, err
	}

	if cfg.Mode.ServesHTTP() {
		if err := s.openCommands(); err != nil {
			return nil, err
		}
	}
	if cfg.Mode.RunsWorker() {
		if s.worker, err = worker.New(worker.Config{
			Runner:               s.runner,
			Channel:              s.ch,
			Logger:               s.log,
			DeadLetters:          s.dead,
			SafetyNetInterval:    cfg.SafetyNet,
			Retry:                cfg.Retry,
			DisableReplayOnStart: cfg.DisableReplayOnStart,
			Horizon:              s.store,                    // names a transaction that holds the projections back
			RouterFunc:           s.metrics.AddRouterMetrics, // Watermill's handler metrics
		}); err != nil {
			return nil, err
		}
	}
	if err := s.watch(); err != nil {
		return nil, err
	}
	return s, nil
}

// watch registers the scrape-time metrics of what this process runs: the projections' lag,
// state and condition and their dead letters always, the worker's trigger counters with it.
func (s *service) watch() error {
	names := s.runner.Names()
	if err := s.metrics.WatchRunner(s.runner); err != nil {
		return err
	}
	if err := s.metrics.WatchDeadLetters(s.dead, names...); err != nil {
		return err
	}
	if s.worker != nil {
		return s.metrics.WatchWorker(s.worker, names...)
	}
	return nil
}

// openChannel connects the trigger channel and creates its tables or topology.
func (s *service) openChannel(ctx context.Context) error {
	switch s.cfg.Channel {
	case ChannelAMQP:
		ch, err := amqpchannel.New(ctx, amqpchannel.Config{
			URL: s.cfg.AMQPURL, Prefix: s.cfg.AMQPPrefix, Logger: s.log,
			ConnectionName: s.cfg.AMQPPrefix + "tickets-" + string(s.cfg.Mode),
		})
		if err != nil {
			return err
		}
		s.ch = ch
	case ChannelPostgres:
		var err error
		if s.chPool, err = connect(ctx, s.cfg.DatabaseURL, channelPoolMaxConns); err != nil {
			return err
		}
		ch, err := pgchannel.New(s.chPool, pgchannel.Config{Schema: s.cfg.Schema, PollInterval: s.cfg.PollInterval, Logger: s.log})
		if err != nil {
			return err
		}
		s.ch = ch
		if err := ch.Migrate(ctx); err != nil {
			return fmt.Errorf("migrate the channel tables: %w", err)
		}
	}
	return nil
}

// openCommands sets up appending: commands append to the store, and a relay tails it and
// publishes the triggers, on either channel. (With the PostgreSQL channel, relay.Appender
// could publish each trigger in its append's transaction instead; it costs every append a
// queue row per projection, see the library's README.)
func (s *service) openCommands() error {
	rel, err := relay.New(s.backend, s.ch, relay.Config{Logger: s.log})
	if err != nil {
		return err
	}
	s.relay = rel
	s.commands = &tickets{store: s.store, appended: rel.Wake}
	return nil
}

// run runs the relay and the worker, as the mode has them, until ctx ends or one of them
// fails; then it stops the other and returns the failure (nil after ctx ended).
func (s *service) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	start := func(name string, fn func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := fn(ctx)
			if err == nil && ctx.Err() == nil {
				err = errors.New("stopped by itself")
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				mu.Unlock()
				cancel()
			}
		}()
	}
	if s.relay != nil {
		start("trigger relay", s.relay.Run)
	}
	if s.worker != nil {
		start("worker", s.worker.Run)
	}
	wg.Wait()
	return errors.Join(errs...)
}

// close releases the channel and the pools.
func (s *service) close() {
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
// database and user, never the password.
func connect(ctx context.Context, rawURL string, maxConns int32) (*pgxpool.Pool, error) {
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
