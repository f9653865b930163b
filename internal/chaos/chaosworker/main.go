// Command chaosworker is the worker process of the fault-injection suite (internal/chaos): it
// runs the three chaosmodel projections (or those -projections names) with a worker.Worker on
// RabbitMQ triggers, dead letters in PostgreSQL, until SIGTERM or SIGINT. With -partitions the
// exactly-once projection is partitioned and the worker runs the partitions it holds leases on
// (worker.Config.Leases), sharing them with the other workers of the scenario. The suite builds it once and starts, kills and
// restarts it many times.
//
// Secrets come from the environment, never from flags (which anyone can read in ps):
//
//	CHAOS_DATABASE_URL  PostgreSQL URL of the scenario's database
//	CHAOS_AMQP_URL      RabbitMQ URL
//
// It logs JSON lines to stderr and prints "ready" to stdout once its handlers are subscribed.
// Exit codes: 0 after a signal, 1 when it cannot start or its worker fails.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	dlpostgres "github.com/nudgeworks/nudge/deadletter/postgres"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/chaos/chaosmodel"
	"github.com/nudgeworks/nudge/projection"
	pgproj "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/retry"
	"github.com/nudgeworks/nudge/worker"
)

// Environment variables holding the connection URLs.
const (
	envDatabaseURL = "CHAOS_DATABASE_URL"
	envAMQPURL     = "CHAOS_AMQP_URL"
)

// options are the worker's flags.
type options struct {
	name         string
	queueType    string
	prefix       string
	sink         string
	safetyNet    time.Duration
	batchSize    int
	attempts     int
	retryInitial time.Duration
	startup      time.Duration
	debug        bool
	park         bool
	exactVersion int
	flipHold     time.Duration
	// buildLagTarget paces a version of the exactly-once projection built beside the active one.
	buildLagTarget time.Duration
	partitions     int
	projections    string
	owner          string
	leaseTTL       time.Duration
	leaseRenew     time.Duration
	fleet          int
	fleetSplit     int
}

func main() {
	var o options
	flag.StringVar(&o.name, "name", "chaosworker", "worker `name`; its RabbitMQ connection is named <prefix><name>")
	flag.StringVar(&o.prefix, "prefix", "", "`prefix` of the RabbitMQ exchanges, queues and connection names")
	flag.StringVar(&o.sink, "sink", "", "`file` the file projection appends to (one per process)")
	flag.DurationVar(&o.safetyNet, "safety-net", 10*time.Second, "safety-net `interval`")
	flag.IntVar(&o.batchSize, "batch", 100, "batch `size` of the projections")
	flag.IntVar(&o.attempts, "attempts", 3, "attempts of a failing trigger before it is dead-lettered")
	flag.DurationVar(&o.retryInitial, "retry-initial", 100*time.Millisecond, "first retry `wait`")
	flag.DurationVar(&o.startup, "startup-timeout", 20*time.Second, "how long to retry the first connections")
	flag.BoolVar(&o.debug, "debug", false, "log at debug level")
	flag.BoolVar(&o.park, "park", false, "the exactly-once projection parks a failing stream after -attempts failures")
	flag.IntVar(&o.exactVersion, "exact-version", 0, "`version` of the exactly-once projection (0: unversioned)")
	flag.DurationVar(&o.flipHold, "flip-hold", 0,
		"how long the exactly-once projection's cut-over waits in its ActivateFunc, between the lines \"flip-hold\" and \"flip-hold-end\" on stdout")
	flag.DurationVar(&o.buildLagTarget, "build-lag-target", 0, "the exactly-once projection's BuildLagTarget (0: the library's default; negative: unpaced)")
	flag.IntVar(&o.partitions, "partitions", 0,
		"split the exactly-once projection (the version -exact-version names) into `n` partitions, spread over the workers with leases (0 or 1: unpartitioned)")
	flag.StringVar(&o.projections, "projections", "all", "`names` of the projections to run, comma-separated, or all")
	flag.StringVar(&o.owner, "owner", "", "lease `owner` of this process with -partitions (defaults to -name)")
	flag.DurationVar(&o.leaseTTL, "lease-ttl", 0, "lease `TTL` with -partitions (0: lease.TTLDefault)")
	flag.DurationVar(&o.leaseRenew, "lease-renew", 0, "lease renewal `interval` with -partitions (0: lease.RenewDefault)")
	flag.StringVar(&o.queueType, "queue-type", "", "`kind` of the RabbitMQ queues: classic or quorum (default: the channel's)")
	flag.IntVar(&o.fleet, "fleet", 0, "run `n` fleet projections (chaosmodel.FleetProjection) besides the -projections")
	flag.IntVar(&o.fleetSplit, "fleet-partitioned", -1, "split the first `k` fleet projections as -partitions, the others not (negative: all)")
	flag.Parse()

	level := slog.LevelInfo
	if o.debug {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})).
		With(slog.String("worker", o.name), slog.Int("pid", os.Getpid()))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	err := run(ctx, o, logger)
	stop()
	if err != nil {
		logger.Error("chaosworker failed", slog.Any("error", err))
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, logger *slog.Logger) error {
	dbURL, amqpURL := os.Getenv(envDatabaseURL), os.Getenv(envAMQPURL)
	if dbURL == "" || amqpURL == "" || o.sink == "" {
		return fmt.Errorf("set %s and %s, and pass -sink", envDatabaseURL, envAMQPURL)
	}
	pool, err := connect(ctx, dbURL, o.startup)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := espg.New(pool, espg.Config{})
	if err != nil {
		return err
	}
	backend, err := pgproj.New(store)
	if err != nil {
		return err
	}
	dead, err := dlpostgres.New(pool, dlpostgres.Config{})
	if err != nil {
		return err
	}
	idemPool, err := asyncCommitPool(ctx, dbURL)
	if err != nil {
		return err
	}
	defer idemPool.Close()
	models, err := chaosmodel.New(chaosmodel.Config{DB: idemPool, SinkPath: o.sink, BatchSize: o.batchSize, ParkAfter: parkAfter(o),
		ExactVersion: o.exactVersion, ActivateFunc: flipHold(o.flipHold), Partitions: o.partitions,
		BuildLagTarget: o.buildLagTarget, Fleet: o.fleet, FleetPartitioned: o.fleetSplit})
	if err != nil {
		return err
	}
	defer func() { _ = models.Close() }()
	projections, err := selectProjections(models.Projections[:3], o.projections)
	if err != nil {
		return err
	}
	projections = append(projections, models.Projections[3:]...) // the fleet's, if any
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: logger}, projections...)
	if err != nil {
		return err
	}
	began := time.Now()
	if err := runner.Init(ctx); err != nil {
		return fmt.Errorf("init the projections: %w", err)
	}
	logger.Info("chaosworker: projections initialised", slog.Int("projections", len(projections)), slog.Duration("took", time.Since(began)))
	ch, err := amqpchannel.New(ctx, amqpchannel.Config{URL: amqpURL, Prefix: o.prefix, ConnectionName: o.prefix + o.name,
		Logger: logger, StartupTimeout: o.startup, QueueType: amqpchannel.QueueType(o.queueType)})
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	w, err := worker.New(worker.Config{
		Runner:            runner,
		Channel:           ch,
		Logger:            logger,
		SafetyNetInterval: o.safetyNet,
		DeadLetters:       dead,
		Retry:             retry.Policy{MaxAttempts: o.attempts, InitialInterval: o.retryInitial},
		CloseTimeout:      5 * time.Second,
		Horizon:           store,
		Leases:            leases(o, pool),
	})
	if err != nil {
		return err
	}
	go func() {
		select {
		case <-w.Running():
			fmt.Println("ready")
		case <-ctx.Done():
		}
	}()
	return w.Run(ctx)
}

// selectProjections returns the projections named in which ("all" or a comma-separated list
// of chaosmodel.Names: a versioned projection by its name, whatever its version).
func selectProjections(all []*projection.Projection, which string) ([]*projection.Projection, error) {
	if which == "all" {
		return all, nil
	}
	var out []*projection.Projection
	for _, name := range strings.Split(which, ",") {
		i := slices.IndexFunc(all, func(p *projection.Projection) bool { return p.Base() == strings.TrimSpace(name) })
		if i < 0 {
			return nil, fmt.Errorf("-projections: unknown projection %q; use all or some of %s", name, strings.Join(chaosmodel.Names(), ", "))
		}
		out = append(out, all[i])
	}
	return out, nil
}

// leases is the worker's Config.Leases: with -partitions, leases in the scenario's database
// under the owner -owner (or -name); nil otherwise.
func leases(o options, pool *pgxpool.Pool) *worker.Leases {
	if o.partitions <= 1 {
		return nil
	}
	return &worker.Leases{DB: pool, Owner: cmp.Or(o.owner, o.name), TTL: o.leaseTTL, Renew: o.leaseRenew}
}

// connect opens the pool and waits, up to timeout, for the server to answer.
func connect(ctx context.Context, dbURL string, timeout time.Duration) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, errors.New("CHAOS_DATABASE_URL is not a valid PostgreSQL URL")
	}
	cfg.MaxConns = 12
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	where := fmt.Sprintf("%s:%d/%s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL at %s: %w", where, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		err := pool.Ping(ctx)
		if err == nil {
			return pool, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			pool.Close()
			return nil, fmt.Errorf("PostgreSQL at %s did not answer within %s: %w", where, timeout, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// asyncCommitPool is the pool of the at-least-once table model's upserts, which commit one by
// one outside the batch's transaction: with synchronous_commit=off they do not each wait for a
// WAL flush (with fsync=on on a shared disk that would make the model the slowest part of
// every scenario). No upsert is lost for it: it commits before the projection's position, whose
// synchronous commit flushes the WAL up to its own record, so also every earlier upsert; a
// crash before that flush loses the position too, and the events are handled again.
func asyncCommitPool(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, errors.New("CHAOS_DATABASE_URL is not a valid PostgreSQL URL")
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	return pgxpool.NewWithConfig(ctx, cfg)
}

// parkAfter is chaosmodel.Config.ParkAfter: the retry budget with -park, so a stream parks on
// a trigger's last attempt; else 0.
func parkAfter(o options) int {
	if !o.park {
		return 0
	}
	return o.attempts
}

// flipHold is the exactly-once projection's ActivateFunc with -flip-hold: it prints
// "flip-hold", waits hold (inside the cut-over's transaction, which holds both versions' locks
// and has replaced the view), then prints "flip-hold-end", so the suite can kill the process
// inside the flip and tell that it did. nil without -flip-hold.
func flipHold(hold time.Duration) func(context.Context) error {
	if hold <= 0 {
		return nil
	}
	return func(ctx context.Context) error {
		fmt.Println("flip-hold")
		select {
		case <-time.After(hold):
		case <-ctx.Done():
			return ctx.Err()
		}
		fmt.Println("flip-hold-end")
		return nil
	}
}
