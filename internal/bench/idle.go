package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nudgeworks/nudge/internal/backoff"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/worker"
)

// idleProjections run on the PostgreSQL queue in the idle scenario.
const idleProjections = 10

// targetIdleCost is the most an idle projection may cost the server once it is woken instead
// of polled: "about zero".
var targetIdleCost = Target{Name: "transactions/s per idle projection, woken (PostgreSQL queue and relay)", Op: AtMost, Threshold: 1, Unit: "tx/s"}

// runIdle measures what idle projections cost the server: a worker with idleProjections
// projections on the PostgreSQL queue, fed by a relay, with nothing appended, polled only
// (-no-listen) and woken by LISTEN/NOTIFY, each on a database of its own. The figure is the
// database's committed and rolled-back transactions (pg_stat_database) over the window:
// every poll of a subscription or of the relay is one transaction. PostgreSQL's statistics
// reach pg_stat_database up to a second or so late (longer from backends that went idle), so
// the window is long beside that.
func runIdle(ctx context.Context, h *harness, sec *Section) error {
	window := h.sizes.idleWindow
	sec.Params["projections"], sec.Params["window_s"], sec.Params["pg_poll_ms"] = idleProjections, window.Seconds(), Ms(h.opts.pgPoll)
	table := &Table{Header: []string{"case", "tx/s (database)", "tx/s per projection", "baseline", "ratio"}}
	sec.table = table
	saved := h.opts.noListen
	defer func() { h.opts.noListen = saved }()
	var polled float64
	for _, listen := range []bool{false, true} {
		h.opts.noListen = !listen
		rate, err := h.idleRun(ctx, chPostgres, idleProjections, idleProjections+6, 3*time.Second, window)
		if err != nil {
			return err
		}
		label := fmt.Sprintf("polled (queue every %s, relay every %s–%s)", h.opts.pgPoll, h.opts.relayInterval, "25ms")
		m := Metric{Case: "polled", Name: "tx_per_s_per_projection", Unit: "tx/s", Value: rate / idleProjections,
			Extra: map[string]float64{"tx_per_s_database": rate}}
		baseline, ratio := "", ""
		if listen {
			label = "woken (LISTEN/NOTIFY; fallback: one queue sweep per 10 s, relay poll 1 s)"
			m.Case = "woken"
			m = m.WithBaseline("polled", polled/idleProjections)
			baseline, ratio = FormatValue(polled/idleProjections, ""), FormatValue(m.Ratio, "×")
			sec.AddCheck(targetIdleCost, fmt.Sprintf("over %s", window), m.Value)
		} else {
			polled = rate
		}
		sec.AddMetric(m)
		table.Add(label, FormatValue(rate, ""), FormatValue(m.Value, ""), baseline, ratio)
		h.log.InfoContext(ctx, "idle run done", slog.Bool("listen", listen), slog.Float64("tx_per_s", rate))
	}
	sec.Note("%d projections on the PostgreSQL queue, fed by a relay, nothing appended; the worker's 30 s safety net is on; transactions counted in pg_stat_database (no pg_stat_statements here)", idleProjections)
	return nil
}

// idleRun starts a worker of n idle projections on kind and a relay on a fresh database, with
// pools of up to poolSize connections, lets them settle for settle, and returns the database's
// transactions per second over window.
func (h *harness) idleRun(ctx context.Context, kind string, n int, poolSize int32, settle, window time.Duration) (float64, error) {
	f, err := h.newFixture(ctx, poolSize)
	if err != nil {
		return 0, err
	}
	defer f.close()
	f.channelPool = poolSize
	var names []string
	var ps []*projection.Projection
	for i := range n {
		p, err := liveProjection(fmt.Sprintf("idle_%02d", i), "", liveHooks{})
		if err != nil {
			return 0, err
		}
		ps, names = append(ps, p), append(names, p.Name())
	}
	runner, err := projection.NewRunner(f.backend, projection.RunnerConfig{Logger: h.libLog}, ps...)
	if err != nil {
		return 0, err
	}
	if err := runner.Init(ctx); err != nil {
		return 0, err
	}
	w, err := h.openChannel(ctx, f, kind, names)
	if err != nil {
		return 0, err
	}
	defer w.close()
	w.appender, w.store = nil, f.store // a relay feeds the queue
	_, stop, err := h.startWorker(ctx, f, w, runner, worker.Config{})
	if err != nil {
		return 0, err
	}
	defer func() { _ = stop() }()
	// The start-up catch-ups and the pollers' first back-offs pass, and their statistics reach
	// the server's counters.
	if err := backoff.Sleep(ctx, settle); err != nil {
		return 0, err
	}
	before, err := f.transactions(ctx)
	if err != nil {
		return 0, err
	}
	started := time.Now()
	if err := backoff.Sleep(ctx, window); err != nil {
		return 0, err
	}
	after, err := f.transactions(ctx)
	if err != nil {
		return 0, err
	}
	return float64(after-before) / time.Since(started).Seconds(), stop()
}

// transactions returns the fixture database's transactions so far (pg_stat_database), read
// through the maintenance database, so the reading adds none.
func (f *fixture) transactions(ctx context.Context) (int64, error) {
	var n int64
	err := f.db.h.admin.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1`, f.db.name).Scan(&n)
	return n, err
}
