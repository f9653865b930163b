package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgeworks/nudge/eventstore"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/relay"
	"github.com/nudgeworks/nudge/worker"
)

// The blue/green targets.
var (
	targetBuildBeside = Target{Name: "a version built beside raises the live p99 by", Op: AtMost, Threshold: 10, Unit: "%"}
)

// bgName is the blue/green scenario's projection (and its stable table name).
const bgName = "bg"

// bgBuild is a kind of build one blue/green round runs beside the active version: bgBuilds
// are one paced (Config.BuildLagTarget by default) and one at full speed.
type bgBuild struct {
	label  string
	target time.Duration // Config.BuildLagTarget
}

var bgBuilds = []bgBuild{
	{label: "paced by the live lag", target: 0},
	{label: "at full speed", target: -1},
}

// bgProjection is version version of the blue/green projection: the latest version of every
// stream, with the customer of the store's TicketWasRegistered events and the n of the live
// TicketWasUpdated ones, queued per event and sent in one round trip per batch. rec notes the
// live events of each batch.
func bgProjection(version int, target time.Duration, rec *atomic.Pointer[liveRecorder]) (*projection.Projection, error) {
	table := pgx.Identifier{projection.TableName(bgName, version)}.Sanitize()
	registered := `INSERT INTO ` + table + ` (stream, version, customer) VALUES ($1, $2, $3)
		ON CONFLICT (stream) DO UPDATE SET version = EXCLUDED.version, customer = EXCLUDED.customer WHERE ` + table + `.version < EXCLUDED.version`
	updated := `INSERT INTO ` + table + ` (stream, version, n) VALUES ($1, $2, $3)
		ON CONFLICT (stream) DO UPDATE SET version = EXCLUDED.version, n = EXCLUDED.n WHERE ` + table + `.version < EXCLUDED.version`
	return projection.New(bgName, projection.Config{
		Version: version, Tables: []string{bgName}, BuildLagTarget: target, RetireGrace: -1,
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (stream text PRIMARY KEY, version bigint NOT NULL, n bigint, customer text)`)
			return err
		},
		FlushFunc: func(_ context.Context, p projection.FlushParams) error {
			if r := rec.Load(); r != nil {
				r.flush(p.Projection, slices.DeleteFunc(slices.Clone(p.Events), func(e eventstore.Event) bool { return e.Type != "TicketWasUpdated" }))
			}
			return nil
		},
	},
		projection.OnQueued(rebuildEventType, func(_ context.Context, q *projection.Queue, e projection.Event[ticketRegistered]) error {
			q.Queue(registered, e.StreamID, e.StreamVersion, e.Data.Customer)
			return nil
		}),
		projection.OnQueued("TicketWasUpdated", func(_ context.Context, q *projection.Queue, e projection.Event[livePayload]) error {
			q.Queue(updated, e.StreamID, e.StreamVersion, e.Data.N)
			return nil
		}))
}

// bgRun is the state of one blue/green run: the fixture, the channel, and the worker of each
// version deployed so far.
type bgRun struct {
	h       *harness
	f       *fixture
	w       *wiring
	rec     atomic.Pointer[liveRecorder]
	stops   map[int]func() error
	active  int
	history int
}

// runBlueGreen measures what building a new version of a projection beside the active one
// costs the active one's live latency: windows of live appends on RabbitMQ with no build, with
// a build paced by the live lag, and with a build at full speed, in turns; and the builds'
// throughput beside the store's plain rebuild (the first version's catch-up from zero, with no
// live load).
func runBlueGreen(ctx context.Context, h *harness, sec *Section) error {
	sz := h.sizes
	units := []string{bgName}
	for v := 2; v <= 1+len(bgBuilds)*h.bgRoundCount(); v++ {
		u, err := projection.UnitName(bgName, v)
		if err != nil {
			return err
		}
		units = append(units, u)
	}
	f, err := h.newFixture(ctx, int32(sz.liveWriters+len(units)*4+8))
	if err != nil {
		return err
	}
	defer f.close()
	last, err := loadEvents(f.db.pool, sz.blueGreenEvents, sz.rebuildStreams, rebuildEventType, ticketPayload)
	if err != nil {
		return err
	}
	if err := f.waitReadable(ctx, last, rebuildSetupDeadline); err != nil {
		return err
	}
	w, err := h.openChannel(ctx, f, chAMQP, units)
	if err != nil {
		return err
	}
	defer w.close()
	// One relay for the whole run, not one per version's worker: stopping the worker of a
	// replaced version must not hand the publishing over to another relay mid-run.
	w.ownRelay = true
	stopRelay, err := h.startRelay(ctx, f, w)
	if err != nil {
		return err
	}
	defer stopRelay()
	run := &bgRun{h: h, f: f, w: w, stops: map[int]func() error{}, history: sz.blueGreenEvents}
	defer run.stopAll()

	sec.Params["history_events"], sec.Params["rate_per_s"], sec.Params["rounds"] = sz.blueGreenEvents, sz.liveRate, h.bgRoundCount()
	table := &Table{Header: []string{"case", "events/s", "took s", "paced s", "live p50 ms", "live p99 ms", "live max ms", "p99 ratio"}}
	sec.table = table

	plain, err := run.deployFirst(ctx)
	if err != nil {
		return fmt.Errorf("plain rebuild: %w", err)
	}
	plainCase := fmt.Sprintf("plain rebuild, %s events, no live load", Thousands(int64(plain.Events)))
	plainRate := Rate(plain.Events, plain.took)
	sec.AddMetric(Metric{Case: plainCase, Name: "events_per_s", Unit: "events/s", Value: plainRate})
	table.Add(plainCase, FormatValue(plainRate, "events/s"), fmt.Sprintf("%.1f", plain.took.Seconds()), "", "", "", "", "")

	live := liveConfig{rate: sz.liveRate, writers: sz.liveWriters, streams: sz.liveStreams, duration: sz.liveDuration}
	warm := live
	warm.duration = max(2*time.Second, sz.liveDuration/4)
	if _, err := run.window(ctx, warm, nil); err != nil { // not measured: the first batches, connections and queues warm up
		return fmt.Errorf("live, warming up: %w", err)
	}
	var (
		none    [][]time.Duration
		builds  = make([][][]time.Duration, len(bgBuilds))
		results = make([][]bgResult, len(bgBuilds))
	)
	for range h.bgRoundCount() {
		samples, err := run.window(ctx, live, nil)
		if err != nil {
			return fmt.Errorf("live, no build: %w", err)
		}
		none = append(none, samples)
		for i, b := range bgBuilds {
			var res bgResult
			samples, err := run.window(ctx, live, func(ctx context.Context, done func()) error {
				var err error
				res, err = run.deployNext(ctx, b.target, done)
				return err
			})
			if err != nil {
				return fmt.Errorf("live, build %s: %w", b.label, err)
			}
			builds[i] = append(builds[i], samples)
			results[i] = append(results[i], res)
			h.log.InfoContext(ctx, "blue/green build done", slog.String("build", b.label), slog.Int("events", res.Events),
				slog.Duration("took", res.took), slog.Duration("paced", res.Paced),
				slog.Float64("p99_ms", Ms(Summarize(samples).P99)), slog.Float64("p99_none_ms", Ms(Summarize(none[len(none)-1]).P99)))
		}
	}
	noneLat := Summarize(slices.Concat(none...))
	noneCase := fmt.Sprintf("live, RabbitMQ, %d appends/s, no build", sz.liveRate)
	sec.AddMetric(Metric{Case: noneCase, Name: "p99_ms", Unit: "ms", Value: Ms(noneLat.P99), Extra: noneLat.Extra()})
	table.Add(noneCase, "", "", "", FormatValue(Ms(noneLat.P50), "ms"), FormatValue(Ms(noneLat.P99), "ms"), FormatValue(Ms(noneLat.Max), "ms"), "")
	for i, b := range bgBuilds {
		lat := Summarize(slices.Concat(builds[i]...))
		var events int
		var took, paced, held time.Duration
		for _, r := range results[i] {
			events, took, paced, held = events+r.Events, took+r.took, paced+r.Paced, max(held, r.CutOverHeld)
		}
		c := fmt.Sprintf("live, RabbitMQ, %d appends/s, a version built beside %s", sz.liveRate, b.label)
		m := Metric{Case: c, Name: "p99_ms", Unit: "ms", Value: Ms(lat.P99), Extra: lat.Extra()}.WithBaseline(noneCase, Ms(noneLat.P99))
		sec.AddMetric(m)
		rate := Rate(events, took)
		buildCase := "build beside " + b.label
		sec.AddMetric(Metric{Case: buildCase, Name: "events_per_s", Unit: "events/s", Value: rate,
			Extra: map[string]float64{"paced_s": paced.Seconds(), "cut_over_held_ms": Ms(held)}}.WithBaseline(plainCase, plainRate))
		table.Add(c, FormatValue(rate, "events/s"), fmt.Sprintf("%.1f", took.Seconds()), fmt.Sprintf("%.1f", paced.Seconds()),
			FormatValue(Ms(lat.P50), "ms"), FormatValue(Ms(lat.P99), "ms"), FormatValue(Ms(lat.Max), "ms"), FormatValue(m.Ratio, "×"))
		if b.target == 0 {
			sec.AddCheck(targetBuildBeside, c, 100*(m.Ratio-1))
		}
		h.log.InfoContext(ctx, "blue/green build measured", slog.String("build", b.label), slog.Float64("events_per_s", rate),
			slog.Float64("p99_ms", Ms(lat.P99)), slog.Float64("p99_none_ms", Ms(noneLat.P99)), slog.Duration("paced", paced),
			slog.Duration("cut_over_held", held))
	}
	sec.Note("each round: %s of live appends with no build, then a new version built beside the active one while the appends go on "+
		"(from position zero over the %s events loaded, until its cut-over), paced by the active version's lag (BuildLagTarget %s), then one "+
		"at full speed; %d rounds, samples pooled per case; the plain rebuild is the first version's catch-up from zero with no live load; "+
		"the build's events/s counts its history and its cut-over",
		sz.liveDuration, Thousands(int64(sz.blueGreenEvents)), projection.BuildLagTargetDefault, h.bgRoundCount())
	return nil
}

// bgResult is one build: its catch-up's result and wall time, from the worker's start to the
// cut-over.
type bgResult struct {
	projection.Result
	took time.Duration
}

// deployFirst runs a worker of version 1, the first version (active at once), and returns its
// catch-up from zero over the store: the plain rebuild.
func (r *bgRun) deployFirst(ctx context.Context) (bgResult, error) {
	p, err := bgProjection(1, 0, &r.rec)
	if err != nil {
		return bgResult{}, err
	}
	runner, err := r.newRunner(p, nil)
	if err != nil {
		return bgResult{}, err
	}
	started := time.Now()
	res, err := runner.CatchUp(ctx, p.Name())
	took := time.Since(started)
	if err != nil {
		return bgResult{}, err
	}
	if res.Events != r.history {
		return bgResult{}, fmt.Errorf("version 1 handled %d events, want %d", res.Events, r.history)
	}
	if err := r.start(ctx, 1, runner); err != nil {
		return bgResult{}, err
	}
	r.active = 1
	return bgResult{Result: res, took: took}, nil
}

// deployNext deploys the next version beside the active one, paced by target, waits for its
// cut-over, calls done and stops the worker of the version it replaced.
func (r *bgRun) deployNext(ctx context.Context, target time.Duration, done func()) (bgResult, error) {
	version := r.active + 1
	p, err := bgProjection(version, target, &r.rec)
	if err != nil {
		return bgResult{}, err
	}
	var (
		mu      sync.Mutex
		res     bgResult
		started = time.Now()
	)
	runner, err := r.newRunner(p, func(cu projection.Result) {
		mu.Lock()
		defer mu.Unlock()
		res.Events, res.Paced = res.Events+cu.Events, res.Paced+cu.Paced
		if cu.Activated {
			res.Activated, res.CutOverHeld, res.took = true, cu.CutOverHeld, time.Since(started)
		}
	})
	if err != nil {
		return bgResult{}, err
	}
	if err := r.start(ctx, version, runner); err != nil {
		return bgResult{}, err
	}
	err = waitUntil(ctx, 10*time.Minute, 10*time.Millisecond, fmt.Sprintf("version %d cut over", version), func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return res.Activated, nil
	})
	done()
	if err != nil {
		return bgResult{}, err
	}
	if err := r.stop(r.active); err != nil {
		return bgResult{}, err
	}
	r.active = version
	mu.Lock()
	defer mu.Unlock()
	if res.Events < r.history {
		return res, fmt.Errorf("version %d handled %d events before its cut-over, want at least %d", version, res.Events, r.history)
	}
	return res, nil
}

// newRunner registers p with a runner whose batch reports go to the current recorder, and
// whose catch-ups go to onCatchUp, if set.
func (r *bgRun) newRunner(p *projection.Projection, onCatchUp func(projection.Result)) (*projection.Runner, error) {
	cfg := projection.RunnerConfig{Logger: r.h.libLog, OnBatch: func(b projection.BatchReport) {
		if rec := r.rec.Load(); rec != nil {
			rec.onBatch(b)
		}
	}}
	if onCatchUp != nil {
		cfg.OnCatchUp = func(_ string, res projection.Result, _ error) { onCatchUp(res) }
	}
	runner, err := projection.NewRunner(r.f.backend, cfg, p)
	if err != nil {
		return nil, err
	}
	return runner, runner.Init(context.Background())
}

// start runs a worker of runner as version's deploy.
func (r *bgRun) start(ctx context.Context, version int, runner *projection.Runner) error {
	_, stop, err := r.h.startWorker(ctx, r.f, r.w, runner, worker.Config{SafetyNetInterval: -1})
	if err != nil {
		return err
	}
	r.stops[version] = stop
	return nil
}

func (r *bgRun) stop(version int) error {
	stop := r.stops[version]
	delete(r.stops, version)
	if stop == nil {
		return nil
	}
	return stop()
}

func (r *bgRun) stopAll() {
	for v := range r.stops {
		_ = r.stop(v)
	}
}

// window appends at live's rate and measures the projection's live latency, whichever of its
// versions handles the events: for live.duration with no build (build nil), else from the
// build's start until its cut-over.
func (r *bgRun) window(ctx context.Context, live liveConfig, build func(ctx context.Context, done func()) error) ([]time.Duration, error) {
	rec := newLiveRecorder([]string{bgName})
	rec.alias = func(unit string) string { base, _, _ := strings.Cut(unit, ".v"); return base }
	r.rec.Store(rec)
	defer r.rec.Store(nil)
	var (
		built    atomic.Bool
		buildErr = make(chan error, 1)
	)
	if build != nil {
		live.duration, live.until = 30*time.Minute, built.Load
		go func() { buildErr <- build(ctx, func() { built.Store(true) }) }()
	}
	appended, err := appendPaced(ctx, r.w, live, rec)
	if build != nil {
		built.Store(true)
		err = errors.Join(err, <-buildErr)
	}
	if err != nil {
		return nil, err
	}
	if err := waitUntil(ctx, time.Minute, 5*time.Millisecond, "every live event visible", func() (bool, error) { return rec.complete(), nil }); err != nil {
		return nil, fmt.Errorf("%w (%s)", err, rec.progress())
	}
	if appended == 0 {
		return nil, errors.New("no live event appended")
	}
	if at, lat := rec.slowest(); lat > time.Second {
		r.h.log.WarnContext(ctx, "blue/green: a live event took over a second", slog.Time("appended_at", at), slog.Duration("latency", lat))
	}
	return rec.samples(), nil
}

// bgRoundCount is how many rounds runBlueGreen runs: one (each round builds a million events
// twice by default).
func (h *harness) bgRoundCount() int { return 1 }

// startRelay runs a relay publishing f's appends to w until the returned function is called.
func (h *harness) startRelay(ctx context.Context, f *fixture, w *wiring) (func(), error) {
	rcfg, err := h.relayConfig(f)
	if err != nil {
		return nil, err
	}
	rel, err := relay.New(f.backend, w.ch, rcfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := rel.Run(ctx); err != nil && ctx.Err() == nil {
			h.log.Error("bluegreen: the relay stopped", slog.Any("error", err))
		}
	}()
	return func() { cancel(); <-done }, nil
}
