package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
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
	targetBuildBeside = Target{Name: "a version built beside raises the live p99 (vs no build) by", Op: AtMost, Threshold: 10, Unit: "%"}
)

// bgName is the blue/green scenario's projection (and its stable table name).
const bgName = "bg"

// bgBuild is a kind of build runBlueGreen runs beside the active version.
type bgBuild struct {
	label  string
	target time.Duration // Config.BuildLagTarget
	// window bounds the build: 0, it runs to its cut-over; else it runs this long, then its
	// worker stops (its rate and the live latency meanwhile are what it is there for).
	window time.Duration
}

// bgBuilds are the builds runBlueGreen runs, in turn, each a new version from position zero:
// one paced by the live lag (Config.BuildLagTarget by default) for a bounded window — at the
// small share of the machine it takes while the live projection is busy, a million events
// take longer than the bench should — then one at full speed to its cut-over, which shows
// what the pacing spares the live projection.
func (h *harness) bgBuilds() []bgBuild {
	window := 30 * time.Second
	if h.sizes.blueGreenEvents < 1_000_000 {
		window = 5 * time.Second
	}
	return []bgBuild{
		{label: "paced by the live lag", target: 0, window: window},
		{label: "at full speed", target: -1},
	}
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
	latest  int // the highest version deployed
	history int
}

// runBlueGreen measures what building a new version of a projection beside the active one
// costs the active one's live latency: live appends go on at a steady rate on RabbitMQ through
// a window with no build, a build paced by the live lag (from position zero over the loaded
// history, to its cut-over), a bounded build at full speed, and a second window with no build;
// the live events appended during each build are compared to those of the window before (the
// one after shows what the builds' writes still cost once they ended). The builds' throughput goes beside the store's plain rebuild (the first version's
// catch-up from zero, with no live load).
func runBlueGreen(ctx context.Context, h *harness, sec *Section) error {
	sz := h.sizes
	builds := h.bgBuilds()
	units := []string{bgName}
	for v := 2; v <= 1+len(builds); v++ {
		u, err := projection.UnitName(bgName, v)
		if err != nil {
			return err
		}
		units = append(units, u)
	}
	f, err := h.historyFixture(ctx, int32(sz.liveWriters+len(units)*4+8), sz.blueGreenEvents)
	if err != nil {
		return err
	}
	defer f.close()
	w, err := h.openChannel(ctx, f, chAMQP, units)
	if err != nil {
		return err
	}
	defer w.close()
	// A version's queue exists from its worker's start until it is replaced, as in a deploy
	// (the cleanup deletes every unit's): a queue without a consumer makes every publish wait
	// until the trigger is on the broker's disk, and grows for ever — the live p99 rose from
	// 12 ms to 30–60 ms over two minutes with two such queues declared up front.
	if err := w.undeclare(ctx, units[1:]...); err != nil {
		return err
	}
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

	sec.Params["history_events"], sec.Params["rate_per_s"] = sz.blueGreenEvents, sz.liveRate
	table := &Table{Header: []string{"case", "events/s", "took s", "paced s", "live p50 ms", "live p99 ms", "live max ms", "samples", "p99 vs no build"}}
	sec.table = table

	plain, err := run.deployFirst(ctx)
	if err != nil {
		return fmt.Errorf("plain rebuild: %w", err)
	}
	plainCase := fmt.Sprintf("plain rebuild, %s events, no live load", Thousands(int64(plain.Events)))
	plainRate := Rate(plain.Events, plain.took)
	sec.AddMetric(Metric{Case: plainCase, Name: "events_per_s", Unit: "events/s", Value: plainRate})
	table.Add(plainCase, FormatValue(plainRate, "events/s"), fmt.Sprintf("%.1f", plain.took.Seconds()), "", "", "", "", "", "")

	live := liveConfig{rate: sz.liveRate, writers: sz.liveWriters, streams: sz.liveStreams, duration: sz.liveDuration}
	warm := live
	warm.duration = max(2*time.Second, sz.liveDuration/4)
	if _, err := run.window(ctx, warm, nil); err != nil { // not measured: the first batches, connections and queues warm up
		return fmt.Errorf("live, warming up: %w", err)
	}
	// The baseline window lasts as long as the paced build's: the p99 of a few seconds moves
	// by a fifth from one window to the next.
	baseline := live
	baseline.duration = max(live.duration, builds[0].window)
	before, err := run.window(ctx, baseline, nil)
	if err != nil {
		return fmt.Errorf("live, no build: %w", err)
	}
	var (
		during  = make([][]time.Duration, len(builds))
		results = make([]bgResult, len(builds))
	)
	for i, b := range builds {
		samples, err := run.window(ctx, live, func(ctx context.Context, done func()) error {
			var err error
			results[i], err = run.deployNext(ctx, b, done)
			return err
		})
		if err != nil {
			return fmt.Errorf("live, build %s: %w", b.label, err)
		}
		during[i] = results[i].during(samples)
		h.log.InfoContext(ctx, "blue/green build done", slog.String("build", b.label), slog.Int("events", results[i].Events),
			slog.Duration("took", results[i].took), slog.Duration("paced", results[i].Paced), slog.Bool("cut_over", results[i].Activated),
			slog.Float64("p99_ms", Ms(Summarize(during[i]).P99)))
	}
	after, err := run.window(ctx, live, nil)
	if err != nil {
		return fmt.Errorf("live, no build after the builds: %w", err)
	}

	// The baseline is the window before the builds: the one after them may still pay for their
	// writes (a checkpoint the builds' WAL started can end in it), which is the builds' cost.
	noneCase := fmt.Sprintf("live, RabbitMQ, %d appends/s, no build, before the builds", sz.liveRate)
	noneLat := Summarize(latencies(before))
	for _, w := range []struct {
		label string
		lat   Latency
	}{{"before", noneLat}, {"after", Summarize(latencies(after))}} {
		wCase := fmt.Sprintf("live, RabbitMQ, %d appends/s, no build, %s the builds", sz.liveRate, w.label)
		sec.AddMetric(Metric{Case: wCase, Name: "p99_ms", Unit: "ms", Value: Ms(w.lat.P99), Extra: w.lat.Extra()})
		table.Add(wCase, "", "", "", FormatValue(Ms(w.lat.P50), "ms"), FormatValue(Ms(w.lat.P99), "ms"), FormatValue(Ms(w.lat.Max), "ms"),
			strconv.Itoa(w.lat.Count), "")
	}
	for i, b := range builds {
		res := results[i]
		buildCase := "build beside " + b.label
		if b.window > 0 && !res.Activated {
			buildCase += fmt.Sprintf(", first %s", b.window)
		}
		rate := Rate(res.Events, res.took)
		extra := map[string]float64{"took_s": res.took.Seconds(), "paced_s": res.Paced.Seconds(), "cut_over_held_ms": Ms(res.CutOverHeld)}
		if !res.Activated {
			// The head moves on at the live rate: the build comes level at what it gains on it.
			if gain := rate - float64(sz.liveRate); gain > 0 {
				eta := time.Duration(float64(sz.blueGreenEvents-res.Events) / gain * float64(time.Second))
				extra["level_in_s"] = eta.Seconds()
				buildCase += fmt.Sprintf(" (level with the live one in about %s at this rate)", eta.Round(time.Second))
			} else {
				buildCase += " (gaining nothing on the live one at this rate)"
			}
		}
		sec.AddMetric(Metric{Case: buildCase, Name: "events_per_s", Unit: "events/s", Value: rate, Extra: extra}.WithBaseline(plainCase, plainRate))
		table.Add(buildCase, FormatValue(rate, "events/s"), fmt.Sprintf("%.1f", res.took.Seconds()), fmt.Sprintf("%.1f", res.Paced.Seconds()),
			"", "", "", "", "")

		lat := Summarize(during[i])
		liveCase := fmt.Sprintf("live, RabbitMQ, %d appends/s, a version built beside %s", sz.liveRate, b.label)
		m := Metric{Case: liveCase, Name: "p99_ms", Unit: "ms", Value: Ms(lat.P99), Extra: lat.Extra()}.WithBaseline(noneCase, Ms(noneLat.P99))
		sec.AddMetric(m)
		rise := 100 * (m.Ratio - 1)
		table.Add(liveCase, "", "", "", FormatValue(Ms(lat.P50), "ms"), FormatValue(Ms(lat.P99), "ms"),
			FormatValue(Ms(lat.Max), "ms"), strconv.Itoa(lat.Count), fmt.Sprintf("%+.0f %%", rise))
		switch {
		case b.target != 0:
		case lat.Count == 0 || noneLat.Count == 0:
			sec.Checks = append(sec.Checks, targetBuildBeside.Missed(fmt.Sprintf("%s: %d live events counted during the build, %d with none",
				b.label, lat.Count, noneLat.Count)))
		default:
			sec.AddCheck(targetBuildBeside, liveCase, rise)
		}
		h.log.InfoContext(ctx, "blue/green build measured", slog.String("build", b.label), slog.Float64("events_per_s", rate),
			slog.Float64("p99_ms", Ms(lat.P99)), slog.Float64("p99_no_build_ms", Ms(noneLat.P99)), slog.Float64("p99_rise_pct", rise),
			slog.Duration("paced", res.Paced), slog.Duration("cut_over_held", res.CutOverHeld))
	}
	for _, res := range results {
		if res.Activated {
			sec.Params["cut_over_held_ms"] = Ms(res.CutOverHeld)
		}
	}
	sec.Note("live appends at %d/s on RabbitMQ throughout: %s with no build; a new version built beside the active one from position zero "+
		"over the %s events loaded, paced by the active version's lag (BuildLagTarget %s), for %s (then stopped); another at full speed until "+
		"its cut-over; %s with no build again. The p99 rise compares the live events appended during a build with those of the window "+
		"before the builds (the one after may still pay for the builds' writes: a checkpoint their WAL started); the plain rebuild is the first version's catch-up from zero with no live load; a build's events/s counts its history "+
		"(and its cut-over) over its wall time",
		sz.liveRate, baseline.duration, Thousands(int64(sz.blueGreenEvents)), projection.BuildLagTargetDefault, builds[0].window, sz.liveDuration)
	return nil
}

// bgResult is one build: its catch-ups' result, when it started and how long it ran (to its
// cut-over, or to the end of its window).
type bgResult struct {
	projection.Result
	started time.Time
	took    time.Duration
}

// during returns the latencies of the live samples appended while the build ran.
func (r bgResult) during(samples []liveSample) []time.Duration {
	end := r.started.Add(r.took)
	return latencies(slices.DeleteFunc(slices.Clone(samples), func(s liveSample) bool {
		return s.appended.Before(r.started) || s.appended.After(end)
	}))
}

// latencies returns the samples' latencies.
func latencies(samples []liveSample) []time.Duration {
	out := make([]time.Duration, len(samples))
	for i, s := range samples {
		out[i] = s.latency
	}
	return out
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
	r.active, r.latest = 1, 1
	return bgResult{Result: res, started: started, took: took}, nil
}

// bgCutOverWithin bounds the wait for a build's cut-over.
const bgCutOverWithin = 10 * time.Minute

// deployNext deploys the next version beside the active one as b says, and waits for its
// cut-over (then stops the worker of the version it replaced) or, for a bounded build, the end
// of its window (then stops its own worker); it calls done when the build ends.
func (r *bgRun) deployNext(ctx context.Context, b bgBuild, done func()) (bgResult, error) {
	defer done()
	r.latest++
	version := r.latest
	p, err := bgProjection(version, b.target, &r.rec)
	if err != nil {
		return bgResult{}, err
	}
	var (
		mu        sync.Mutex
		res       = bgResult{started: time.Now()}
		activated = make(chan struct{})
	)
	runner, err := r.newRunner(p, func(cu projection.Result) {
		mu.Lock()
		defer mu.Unlock()
		res.Events, res.Paced = res.Events+cu.Events, res.Paced+cu.Paced
		if cu.Activated && !res.Activated {
			res.Activated, res.CutOverHeld, res.took = true, cu.CutOverHeld, time.Since(res.started)
			close(activated)
		}
	})
	if err != nil {
		return bgResult{}, err
	}
	if err := r.start(ctx, version, runner); err != nil {
		return bgResult{}, err
	}
	limit := bgCutOverWithin
	if b.window > 0 {
		limit = b.window
	}
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case <-activated:
	case <-ctx.Done():
		return bgResult{}, ctx.Err()
	case <-timer.C:
		if b.window == 0 {
			return bgResult{}, fmt.Errorf("version %d: no cut-over within %s", version, limit)
		}
		took := time.Since(res.started)
		if err := r.stop(version); err != nil {
			return bgResult{}, err
		}
		if err := r.w.undeclare(ctx, p.Name()); err != nil { // the version is abandoned
			return bgResult{}, err
		}
		st, err := runner.Status(ctx, p.Name())
		if err != nil {
			return bgResult{}, err
		}
		mu.Lock()
		defer mu.Unlock()
		res.Events, res.took = int(st.EventsProcessed), took
		return res, nil
	}
	if err := r.stop(r.active); err != nil {
		return bgResult{}, err
	}
	// What the active version's worker does by itself once it finds the queue unused (within
	// its retry interval of 10 s), at once: the window after the builds starts without it.
	if err := r.w.undeclare(ctx, r.unit(r.active)); err != nil {
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

// unit is the unit name of version.
func (r *bgRun) unit(version int) string {
	u, _ := projection.UnitName(bgName, version) // the name and versions are valid
	return u
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
func (r *bgRun) window(ctx context.Context, live liveConfig, build func(ctx context.Context, done func()) error) ([]liveSample, error) {
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
	appended, err := appendPaced(ctx, r.w, live, rec.appended)
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
	return rec.timedSamples(), nil
}

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
