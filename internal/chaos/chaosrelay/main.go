// Command chaosrelay is the relay process of the fault-injection suite (internal/chaos): a
// relay.Relay publishing the triggers of a scenario's event store to RabbitMQ, until SIGTERM or
// SIGINT. The relay-kill scenario starts it, SIGKILLs it under load and starts it again.
//
// Secrets come from the environment, never from flags (which anyone can read in ps):
//
//	CHAOS_DATABASE_URL  PostgreSQL URL of the scenario's database
//	CHAOS_AMQP_URL      RabbitMQ URL
//
// It logs JSON lines to stderr and prints "ready" to stdout once it is connected and relaying.
// Exit codes: 0 after a signal, 1 when it cannot start or the relay fails.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	pgproj "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/relay"
)

func main() {
	name := flag.String("name", "relay", "process `name`; its RabbitMQ connection is named <prefix><name>")
	prefix := flag.String("prefix", "", "`prefix` of the RabbitMQ exchanges, queues and connection names")
	startup := flag.Duration("startup-timeout", 20*time.Second, "how long to retry the first connections")
	flag.Parse()
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil)).
		With(slog.String("process", *name), slog.Int("pid", os.Getpid()), slog.String("projection", relay.NameDefault))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	err := run(ctx, *name, *prefix, *startup, logger)
	stop()
	if err != nil {
		logger.Error("chaosrelay failed", slog.Any("error", err))
		os.Exit(1)
	}
}

func run(ctx context.Context, name, prefix string, startup time.Duration, logger *slog.Logger) error {
	dbURL, amqpURL := os.Getenv("CHAOS_DATABASE_URL"), os.Getenv("CHAOS_AMQP_URL")
	if dbURL == "" || amqpURL == "" {
		return errors.New("set CHAOS_DATABASE_URL and CHAOS_AMQP_URL")
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return errors.New("CHAOS_DATABASE_URL is not a valid PostgreSQL URL")
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
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
	ch, err := amqpchannel.New(ctx, amqpchannel.Config{URL: amqpURL, Prefix: prefix, ConnectionName: prefix + name,
		Logger: logger, StartupTimeout: startup})
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	rel, err := relay.New(backend, ch, relay.Config{Logger: logger, MinInterval: 10 * time.Millisecond, MaxInterval: 50 * time.Millisecond})
	if err != nil {
		return err
	}
	fmt.Println("ready")
	return rel.Run(ctx)
}
