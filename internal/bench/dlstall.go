package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	dlpostgres "github.com/nudgeworks/nudge/deadletter/postgres"
	"github.com/nudgeworks/nudge/internal/redact"
	"github.com/nudgeworks/nudge/internal/stallproxy"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/worker"
)

// targetDeadLetterStall is how much a stalled dead-letter store may raise the live p99 of
// projections that have no dead letter.
var targetDeadLetterStall = Target{Name: "a stalled dead-letter store raises a healthy projection's live p99 by", Op: AtMost, Threshold: 10, Unit: "%"}

// runDeadLetterStall measures, on RabbitMQ, the live latency of healthy projections whose
// worker's dead-letter store is partitioned (a proxy that accepts and forwards nothing) against
// that of projections whose worker's store answers, side by side in the same runs: two workers
// on one runner, the odd-numbered projections on the stalled one, the even-numbered on the
// other (the other way round every other run), each store behind a proxy of its own.
func runDeadLetterStall(ctx context.Context, h *harness, sec *Section) error {
	sz := h.sizes
	cfg := liveConfig{channel: chAMQP, projections: sz.slowLiveProjection, rate: sz.liveRate, writers: sz.liveWriters,
		streams: sz.liveStreams, duration: max(sz.liveDuration/2, sz.slowLiveDuration), stalledDeadLetters: true}
	sec.Params["rate_per_s"], sec.Params["streams"], sec.Params["projections"] = cfg.rate, cfg.streams, cfg.projections
	sec.Params["duration_s"], sec.Params["rounds"] = cfg.duration.Seconds(), h.parkRoundCount()
	table := &Table{Header: []string{"case", "p50 ms", "p99 ms", "max ms", "median projection p99 ms", "ratio"}}
	sec.table = table
	var answering, stalled [][]time.Duration
	for round := range h.parkRoundCount() {
		cfg.stallEven = round%2 == 1 // the stalled half alternates, so neither half's place favours it
		res, err := h.runLive(ctx, cfg)
		if err != nil {
			return fmt.Errorf("live with half the projections' dead-letter store stalled: %w", err)
		}
		answering, stalled = append(answering, res.clean...), append(stalled, res.parked...)
	}
	half := cfg.projections / 2
	okCase := fmt.Sprintf("live, RabbitMQ, %d projections, dead-letter store answering", cfg.projections-half)
	stCase := fmt.Sprintf("live, RabbitMQ, %d projections, dead-letter store stalled", half)
	okP99, stP99 := addHalves(sec, table, targetDeadLetterStall, okCase, stCase, answering, stalled)
	h.log.InfoContext(ctx, "dead-letter stall run done", slog.Float64("p99_answering_ms", Ms(okP99)), slog.Float64("p99_stalled_ms", Ms(stP99)))
	sec.Note("two workers on one runner and one RabbitMQ channel, each with its dead letters in PostgreSQL behind a proxy of its own; "+
		"after the warm-up one half's proxy stalls for the measured window (accepts, forwards nothing: a partition; the odd-numbered projections' and the even-numbered in turn), "+
		"so each of their catch-ups asks to resolve healed dead letters of a store that never answers (DeadLetterTimeout %s); "+
		"no projection fails; %d appends/s from %d writers over %d streams, side by side under the same load; %d runs; the target "+
		"compares the median of the projections' own p99s", worker.DeadLetterTimeoutDefault, cfg.rate, cfg.writers, cfg.streams, h.parkRoundCount())
	return nil
}

// liveWorkers runs the workers of a live run: one for every projection, or with
// cfg.stalledDeadLetters two, the odd-numbered projections (stalled) on one whose dead-letter
// store is behind a proxy the run stalls, the others on one whose store is behind a proxy that
// flows. stop stops them (and closes the proxies).
type liveWorkers struct {
	stop    func() error
	stalled *stallproxy.Proxy // nil without cfg.stalledDeadLetters
}

// affected reports whether the projection called name is in the half a poisoned run poisons
// or a run with stalledDeadLetters stalls.
func (cfg liveConfig) affected(name string) bool {
	if cfg.stalledDeadLetters && cfg.stallEven {
		return !poisonedProjection(name)
	}
	return poisonedProjection(name)
}

// startLiveWorkers starts the workers of a live run on w's channel.
func (h *harness) startLiveWorkers(ctx context.Context, f *fixture, w *wiring, runner *projection.Runner, cfg liveConfig, names []string) (liveWorkers, error) {
	if cfg.workers > 1 {
		return h.startSpreadWorkers(ctx, f, w, runner, cfg.workers, names)
	}
	if !cfg.stalledDeadLetters {
		_, stop, err := h.startWorker(ctx, f, w, runner, worker.Config{SafetyNetInterval: -1})
		return liveWorkers{stop: stop}, err
	}
	var (
		lw    liveWorkers
		stops []func() error
	)
	lw.stop = func() error {
		var err error
		for _, s := range slices.Backward(stops) {
			err = errors.Join(err, s())
		}
		return err
	}
	for i, stalled := range []bool{false, true} {
		proxy, dead, err := h.proxiedDeadLetters(ctx, f, int32(cfg.projections))
		if err != nil {
			return lw, errors.Join(err, lw.stop())
		}
		stops = append(stops, proxy.Close)
		var subset []string
		for _, name := range names {
			if cfg.affected(name) == stalled {
				subset = append(subset, name)
			}
		}
		w.ownRelay = i > 0 // the first worker's relay publishes for both
		_, stop, err := h.startWorker(ctx, f, w, runner, worker.Config{SafetyNetInterval: -1, Projections: subset, DeadLetters: dead})
		w.ownRelay = false
		if err != nil {
			return lw, errors.Join(err, lw.stop())
		}
		stops = append(stops, stop)
		if stalled {
			lw.stalled = proxy
		}
	}
	return lw, nil
}

// startSpreadWorkers runs n workers of runner, the projections spread over them round robin;
// the first worker's relay (if any) publishes for all.
func (h *harness) startSpreadWorkers(ctx context.Context, f *fixture, w *wiring, runner *projection.Runner, n int, names []string) (liveWorkers, error) {
	var stops []func() error
	lw := liveWorkers{stop: func() error {
		var err error
		for _, s := range slices.Backward(stops) {
			err = errors.Join(err, s())
		}
		return err
	}}
	for i, subset := range spread(names, n) {
		w.ownRelay = i > 0
		_, stop, err := h.startWorker(ctx, f, w, runner, worker.Config{SafetyNetInterval: -1, Projections: subset})
		w.ownRelay = false
		if err != nil {
			return lw, errors.Join(err, lw.stop())
		}
		stops = append(stops, stop)
	}
	return lw, nil
}

// spread deals names round robin into n non-empty groups (fewer when there are fewer names).
func spread(names []string, n int) [][]string {
	groups := make([][]string, min(n, len(names)))
	for i, name := range names {
		groups[i%len(groups)] = append(groups[i%len(groups)], name)
	}
	return groups
}

// proxiedDeadLetters returns a PostgreSQL dead-letter store on f's database that connects
// through a stall proxy of its own, and the proxy. Closing the proxy ends the pool's
// connections, so the database's close does not wait for them.
func (h *harness) proxiedDeadLetters(ctx context.Context, f *fixture, maxConns int32) (*stallproxy.Proxy, *dlpostgres.Store, error) {
	pcfg, err := pgxpool.ParseConfig(f.db.url)
	if err != nil {
		return nil, nil, fmt.Errorf("parse %s: %w", redact.URL(f.db.url), err)
	}
	proxy, err := stallproxy.Start(net.JoinHostPort(pcfg.ConnConfig.Host, strconv.Itoa(int(pcfg.ConnConfig.Port))))
	if err != nil {
		return nil, nil, err
	}
	pcfg.ConnConfig.Host, pcfg.ConnConfig.Port, pcfg.ConnConfig.Fallbacks = "127.0.0.1", proxy.Port(), nil
	pcfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, errors.Join(err, proxy.Close())
	}
	f.db.pools = append(f.db.pools, pool)
	dead, err := dlpostgres.New(pool, dlpostgres.Config{})
	if err == nil {
		err = dead.Migrate(ctx)
	}
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("dead letters behind a proxy: %w", err), proxy.Close())
	}
	return proxy, dead, nil
}
