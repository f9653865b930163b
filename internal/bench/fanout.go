package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/worker"
)

// targetSlowProjection is how much one slow projection may raise the others' live p99.
var targetSlowProjection = Target{Name: "one slow projection raises the others' live p99 by", Op: AtMost, Threshold: 20, Unit: "%"}

// fanoutPoolSize is the fan-out worker's database connections: projections catching up at once
// beyond it wait for one, as they would in a deployment with a sized pool.
const fanoutPoolSize = 16

func runFanout(ctx context.Context, h *harness, sec *Section) error {
	sz := h.sizes
	sec.Params["events"], sec.Params["streams"], sec.Params["projections"] = sz.fanoutEvents, sz.rebuildStreams, sz.fanoutProjections
	sec.Params["pool_connections"], sec.Params["slow_batch_ms"] = fanoutPoolSize, Ms(slowBatch)
	sec.Params["slow_live_duration_s"], sec.Params["slow_live_projections"] = sz.slowLiveDuration.Seconds(), sz.slowLiveProjection
	table := &Table{Header: []string{"case", "events/s (all projections)", "seconds", "baseline", "ratio", "p50 ms", "p99 ms", "max ms"}}
	sec.table = table

	f, err := h.newFixture(ctx, fanoutPoolSize)
	if err != nil {
		return err
	}
	defer f.close()
	last, err := loadEvents(f.db.pool, sz.fanoutEvents, sz.rebuildStreams, rebuildEventType, ticketPayload)
	if err != nil {
		return err
	}
	if err := f.waitReadable(ctx, last, rebuildSetupDeadline); err != nil {
		return err
	}
	var baseCase string
	var base float64
	for _, n := range sz.fanoutProjections {
		took, err := h.fanoutCatchUp(ctx, f, n)
		if err != nil {
			return fmt.Errorf("%d projections: %w", n, err)
		}
		rate := Rate(n*sz.fanoutEvents, took)
		c := fmt.Sprintf("catch-up, %d projection(s)", n)
		m := Metric{Case: c, Name: "events_per_s", Unit: "events/s", Value: rate,
			Extra: map[string]float64{"projections": float64(n), "seconds": took.Seconds(), "per_projection_events_per_s": rate / float64(n)}}
		baseline, ratio := "", ""
		if baseCase == "" {
			baseCase, base = c, rate
		} else {
			m = m.WithBaseline(baseCase, base)
			baseline, ratio = FormatValue(base, ""), FormatValue(m.Ratio, "×")
		}
		sec.AddMetric(m)
		table.Add(c, FormatValue(rate, ""), FormatValue(took.Seconds(), "s"), baseline, ratio, "", "", "")
		h.log.InfoContext(ctx, "fan-out catch-up done", slog.Int("projections", n), slog.Float64("events_per_s", rate))
	}
	f.close()

	// One slow projection beside the others, live on RabbitMQ: does it hold them back?
	cfg := liveConfig{channel: chAMQP, projections: sz.slowLiveProjection, rate: sz.liveRate, writers: sz.liveWriters,
		streams: sz.liveStreams, duration: sz.slowLiveDuration}
	without, err := h.runLive(ctx, cfg)
	if err != nil {
		return fmt.Errorf("live without the slow projection: %w", err)
	}
	cfg.slow = true
	with, err := h.runLive(ctx, cfg)
	if err != nil {
		return fmt.Errorf("live with the slow projection: %w", err)
	}
	withoutCase := fmt.Sprintf("live, RabbitMQ, %d projections", cfg.projections)
	withCase := withoutCase + " + 1 slow"
	sec.AddMetric(Metric{Case: withoutCase, Name: "p99_ms", Unit: "ms", Value: Ms(without.latency.P99), Extra: without.latency.Extra()})
	m := Metric{Case: withCase, Name: "p99_ms", Unit: "ms", Value: Ms(with.latency.P99), Extra: with.latency.Extra()}.WithBaseline(withoutCase, Ms(without.latency.P99))
	m.Extra["slow_batches"] = float64(with.slowBatches)
	sec.AddMetric(m)
	table.Add(withoutCase, "", "", "", "", FormatValue(Ms(without.latency.P50), "ms"), FormatValue(Ms(without.latency.P99), "ms"), FormatValue(Ms(without.latency.Max), "ms"))
	table.Add(withCase, "", "", FormatValue(Ms(without.latency.P99), "ms")+" ms", FormatValue(m.Ratio, "×"),
		FormatValue(Ms(with.latency.P50), "ms"), FormatValue(Ms(with.latency.P99), "ms"), FormatValue(Ms(with.latency.Max), "ms"))
	sec.AddCheck(targetSlowProjection, withCase, 100*(m.Ratio-1))
	sec.Note("catch-up: set-based projections in SQL (OmitPayloads, batch %d) on one worker (GoChannel, start-up catch-up), %d pool connections; ratio = total events/s over 1 projection's",
		projection.BatchSizeDefault, fanoutPoolSize)
	sec.Note("slow: its batches write, then sleep %s inside their transaction (exempt from the store's horizon: no reader waits for it); p99 is over the other projections only, %d appends/s",
		slowBatch, sz.liveRate)
	return nil
}

// fanoutCatchUp defines n set-based projections (payloads read in SQL) and runs a worker until
// its start-up catch-up has brought every one of them to the end of the store; it returns how
// long that took.
func (h *harness) fanoutCatchUp(ctx context.Context, f *fixture, n int) (time.Duration, error) {
	var ps []*projection.Projection
	var names []string
	for i := range n {
		name := fmt.Sprintf("fan%d_%02d", n, i)
		p, err := sqlSetProjection(name, 0)
		if err != nil {
			return 0, err
		}
		ps, names = append(ps, p), append(names, name)
	}
	var handled atomic.Int64
	runner, err := projection.NewRunner(f.backend, projection.RunnerConfig{Logger: h.libLog, OnBatch: func(b projection.BatchReport) {
		if b.Err == nil {
			handled.Add(int64(b.Events))
		}
	}}, ps...)
	if err != nil {
		return 0, err
	}
	if err := runner.Init(ctx); err != nil {
		return 0, err
	}
	w, err := h.openChannel(ctx, f, chGoChannel, names)
	if err != nil {
		return 0, err
	}
	defer w.close()
	want := int64(n * h.sizes.fanoutEvents)
	started := time.Now()
	_, stop, err := h.startWorker(ctx, f, w, runner, worker.Config{SafetyNetInterval: -1})
	if err != nil {
		return 0, err
	}
	defer func() { _ = stop() }()
	err = waitUntil(ctx, 10*time.Minute, 5*time.Millisecond, "every projection caught up", func() (bool, error) {
		return handled.Load() >= want, nil
	})
	took := time.Since(started)
	if err != nil {
		return took, fmt.Errorf("%w (%d of %d events handled)", err, handled.Load(), want)
	}
	if err := stop(); err != nil {
		return took, err
	}
	for _, name := range names {
		if err := f.checkTickets(ctx, name, h.sizes.fanoutEvents, h.sizes.rebuildStreams); err != nil {
			return took, err
		}
	}
	return took, nil
}
