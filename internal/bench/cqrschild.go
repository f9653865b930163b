package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/channel"
	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
	pgchannel "github.com/nudgeworks/nudge/channel/postgres"
	dlmemory "github.com/nudgeworks/nudge/deadletter/memory"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/projection"
	pgproj "github.com/nudgeworks/nudge/projection/postgres"
	"github.com/nudgeworks/nudge/worker"
)

// cqrsChildEnv, when set, makes the bench binary run one consumer of the cqrs scenario (a
// Watermill CQRS event processor or a nudge worker) described by the JSON cqrsSpec it holds,
// until SIGTERM, instead of the benchmarks. The scenario runs consumers as child processes so
// that it can kill them for real at a chosen point.
const cqrsChildEnv = "NUDGE_BENCH_CQRS_CONSUMER"

// killSelf SIGKILLs this process: no deferred function, no ack, no graceful close runs.
func killSelf() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// runCQRSChild runs the consumer the spec describes and returns the exit code.
func runCQRSChild(raw string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var spec cqrsSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		log.Error("bench consumer: bad spec", slog.Any("error", err))
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	pool, err := openChildPool(ctx, spec.DatabaseURL)
	if err != nil {
		log.Error("bench consumer: connect", slog.Any("error", err))
		return 1
	}
	defer pool.Close()
	log = log.With(slog.String("projection", spec.Table), slog.String("system", spec.System), slog.String("broker", spec.Broker))
	switch spec.System {
	case systemCQRS:
		err = consumeCQRS(ctx, spec, pool, log)
	case systemNudge:
		err = consumeNudge(ctx, spec, pool, log)
	default:
		err = fmt.Errorf("unknown system %q", spec.System)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Error("bench consumer failed", slog.Any("error", err))
		return 1
	}
	return 0
}

// consumeCQRS runs a cqrs.EventProcessor whose handler inserts each event's row and, with
// spec.KillAt, SIGKILLs the process after the KillAt-th insert committed, before the handler
// returns (so before the ack).
func consumeCQRS(ctx context.Context, spec cqrsSpec, pool *pgxpool.Pool, log *slog.Logger) error {
	wlog := watermill.NewSlogLogger(log)
	b, err := openCQRSBroker(spec, pool, wlog)
	if err != nil {
		return err
	}
	defer func() { _ = b.close() }()
	a := newCQRSApplier(pool, spec.Table)
	var applied atomic.Int64
	wait, err := runCQRSProcessor(ctx, b, wlog, func(ctx context.Context, e *TicketWasUpdated) error {
		if err := a.apply(ctx, e); err != nil {
			return err
		}
		if n := applied.Add(1); spec.KillAt > 0 && n >= int64(spec.KillAt) {
			killSelf() // the row is committed; the message is not acked
		}
		return nil
	})
	if err != nil {
		return err
	}
	return wait()
}

// consumeNudge runs a nudge worker of the activity projection and, with spec.KillAt,
// SIGKILLs the process once its batches committed KillAt events, right after a commit and
// before the trigger's ack.
func consumeNudge(ctx context.Context, spec cqrsSpec, pool *pgxpool.Pool, log *slog.Logger) error {
	store, err := espg.New(pool, espg.Config{})
	if err != nil {
		return err
	}
	backend, err := pgproj.New(store)
	if err != nil {
		return err
	}
	p, err := activityProjection(spec.Table, "", liveHooks{})
	if err != nil {
		return err
	}
	var applied atomic.Int64
	runner, err := projection.NewRunner(backend, projection.RunnerConfig{Logger: log, OnBatch: func(b projection.BatchReport) {
		if n := applied.Add(int64(b.Events)); spec.KillAt > 0 && n >= int64(spec.KillAt) {
			killSelf() // the batch is committed; the trigger is not acked
		}
	}}, p)
	if err != nil {
		return err
	}
	if err := runner.Init(ctx); err != nil {
		return err
	}
	ch, err := openNudgeChannel(ctx, spec, pool, log)
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	w, err := worker.New(worker.Config{Runner: runner, Channel: ch, Logger: log, DeadLetters: dlmemory.New(dlmemory.Config{})})
	if err != nil {
		return err
	}
	return w.Run(ctx)
}

// openNudgeChannel opens nudge's channel on spec's broker and declares the projection.
func openNudgeChannel(ctx context.Context, spec cqrsSpec, pool *pgxpool.Pool, log *slog.Logger) (channel.Channel, error) {
	var ch channel.Channel
	var err error
	switch spec.Broker {
	case chAMQP:
		ch, err = amqpchannel.New(ctx, amqpchannel.Config{URL: spec.AMQPURL, Prefix: spec.Prefix, Logger: log})
	case chPostgres:
		ch, err = pgchannel.New(pool, pgchannel.Config{PollInterval: spec.PGPoll, Logger: log})
	default:
		err = fmt.Errorf("unknown broker %q", spec.Broker)
	}
	if err != nil {
		return nil, err
	}
	if err := ch.Declare(ctx, spec.Table); err != nil {
		_ = ch.Close()
		return nil, err
	}
	return ch, nil
}

// openChildPool connects with room for the subscription, the batches and the worker's checks.
func openChildPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 10
	return pgxpool.NewWithConfig(ctx, cfg)
}
