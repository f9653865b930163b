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
	// phase is how long each build runs, then is held, in turn (bgSizes).
	phase time.Duration
}

// bgSettle is how long after each switch of a build (held or resumed) the live events
// appended are not counted: the live projection's backlog of the phase before drains meanwhile
// (an event appended just after the build was held may still wait behind the batches it
// slowed), and a resumed build's pacing takes its first few batches to find its speed again.
const bgSettle = 300 * time.Millisecond

// bgPhase returns how long a build runs, then is held, in turn: 2.5 s, or 1 s in a quick run
// (whose builds take a few seconds).
func (h *harness) bgPhase() time.Duration {
	if h.sizes.blueGreenEvents < 1_000_000 {
		return time.Second
	}
	return 2500 * time.Millisecond
}

// runBlueGreen measures what building a new version of a projection beside the active one
// costs the active one's live latency, side by side in time: during each build (one paced by
// the live lag, one at full speed) the build runs for a phase, then is held (its unit paused)
// for a phase, in turn, until it cuts over, while live appends go on at a steady rate on
// RabbitMQ; the live events appended while it runs are compared to those appended while it is
// held, so the machine's load from outside (other processes on the shared cores) weighs on
// both alike. A window with no build at all, and the builds' throughput beside the store's
// plain rebuild (the first version's catch-up from zero, with no live load), go with them.
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
	// One relay for the whole run, not one per version's worker: stopping the worker of a
	// replaced version must not hand the publishing over to another relay mid-run.
	w.ownRelay = true
	stopRelay, err := h.startRelay(ctx, f, w)
	if err != nil {
		return err
	}
	defer stopRelay()
	run := &bgRun{h: h, f: f, w: w, stops: map[int]func() error{}, history: sz.blueGreenEvents, phase: h.bgPhase()}
	defer run.stopAll()

	sec.Params["history_events"], sec.Params["rate_per_s"], sec.Params["rounds"] = sz.blueGreenEvents, sz.liveRate, h.bgRoundCount()
	sec.Params["phase_s"], sec.Params["settle_s"] = run.phase.Seconds(), bgSettle.Seconds()
	table := &Table{Header: []string{"case", "events/s running", "events/s wall", "took s", "ran s", "paced s",
		"live p50 ms", "live p99 ms", "live max ms", "samples", "p99 rise"}}
	sec.table = table

	plain, err := run.deployFirst(ctx)
	if err != nil {
		return fmt.Errorf("plain rebuild: %w", err)
	}
	plainCase := fmt.Sprintf("plain rebuild, %s events, no live load", Thousands(int64(plain.Events)))
	plainRate := Rate(plain.Events, plain.took)
	sec.AddMetric(Metric{Case: plainCase, Name: "events_per_s", Unit: "events/s", Value: plainRate})
	table.Add(plainCase, FormatValue(plainRate, "events/s"), FormatValue(plainRate, "events/s"), fmt.Sprintf("%.1f", plain.took.Seconds()),
		fmt.Sprintf("%.1f", plain.took.Seconds()), "", "", "", "", "", "")

	live := liveConfig{rate: sz.liveRate, writers: sz.liveWriters, streams: sz.liveStreams, duration: sz.liveDuration}
	warm := live
	warm.duration = max(2*time.Second, sz.liveDuration/4)
	if _, err := run.window(ctx, warm, nil); err != nil { // not measured: the first batches, connections and queues warm up
		return fmt.Errorf("live, warming up: %w", err)
	}
	var (
		none    []time.Duration
		running = make([][]time.Duration, len(bgBuilds))
		held    = make([][]time.Duration, len(bgBuilds))
		results = make([][]bgResult, len(bgBuilds))
	)
	for range h.bgRoundCount() {
		samples, err := run.window(ctx, live, nil)
		if err != nil {
			return fmt.Errorf("live, no build: %w", err)
		}
		for _, s := range samples {
			none = append(none, s.latency)
		}
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
			on, off := res.split(samples)
			running[i], held[i] = append(running[i], on...), append(held[i], off...)
			results[i] = append(results[i], res)
			h.log.InfoContext(ctx, "blue/green build done", slog.String("build", b.label), slog.Int("events", res.Events),
				slog.Duration("took", res.took), slog.Duration("ran", res.ran), slog.Duration("paced", res.Paced),
				slog.Int("switches", len(res.switches)),
				slog.Float64("p99_running_ms", Ms(Summarize(on).P99)), slog.Float64("p99_held_ms", Ms(Summarize(off).P99)))
		}
	}
	noneLat := Summarize(none)
	noneCase := fmt.Sprintf("live, RabbitMQ, %d appends/s, no build", sz.liveRate)
	sec.AddMetric(Metric{Case: noneCase, Name: "p99_ms", Unit: "ms", Value: Ms(noneLat.P99), Extra: noneLat.Extra()})
	table.Add(noneCase, "", "", "", "", "", FormatValue(Ms(noneLat.P50), "ms"), FormatValue(Ms(noneLat.P99), "ms"),
		FormatValue(Ms(noneLat.Max), "ms"), strconv.Itoa(noneLat.Count), "")
	for i, b := range bgBuilds {
		var events int
		var took, ran, paced, cutOver time.Duration
		for _, r := range results[i] {
			events, took, ran, paced, cutOver = events+r.Events, took+r.took, ran+r.ran, paced+r.Paced, max(cutOver, r.CutOverHeld)
		}
		buildCase := "build beside " + b.label
		rate, wall := Rate(events, ran), Rate(events, took)
		sec.AddMetric(Metric{Case: buildCase, Name: "events_per_s", Unit: "events/s", Value: rate,
			Extra: map[string]float64{"events_per_s_wall": wall, "took_s": took.Seconds(), "ran_s": ran.Seconds(),
				"paced_s": paced.Seconds(), "cut_over_held_ms": Ms(cutOver)}}.WithBaseline(plainCase, plainRate))
		table.Add(buildCase, FormatValue(rate, "events/s"), FormatValue(wall, "events/s"), fmt.Sprintf("%.1f", took.Seconds()),
			fmt.Sprintf("%.1f", ran.Seconds()), fmt.Sprintf("%.1f", paced.Seconds()), "", "", "", "", "")

		offLat, onLat := Summarize(held[i]), Summarize(running[i])
		offCase := fmt.Sprintf("live, RabbitMQ, %d appends/s, a version built beside %s, held", sz.liveRate, b.label)
		onCase := fmt.Sprintf("live, RabbitMQ, %d appends/s, a version built beside %s, running", sz.liveRate, b.label)
		sec.AddMetric(Metric{Case: offCase, Name: "p99_ms", Unit: "ms", Value: Ms(offLat.P99), Extra: offLat.Extra()})
		m := Metric{Case: onCase, Name: "p99_ms", Unit: "ms", Value: Ms(onLat.P99), Extra: onLat.Extra()}.WithBaseline(offCase, Ms(offLat.P99))
		sec.AddMetric(m)
		rise := 100 * (m.Ratio - 1)
		table.Add(offCase, "", "", "", "", "", FormatValue(Ms(offLat.P50), "ms"), FormatValue(Ms(offLat.P99), "ms"),
			FormatValue(Ms(offLat.Max), "ms"), strconv.Itoa(offLat.Count), "")
		table.Add(onCase, "", "", "", "", "", FormatValue(Ms(onLat.P50), "ms"), FormatValue(Ms(onLat.P99), "ms"),
			FormatValue(Ms(onLat.Max), "ms"), strconv.Itoa(onLat.Count), fmt.Sprintf("%+.0f %%", rise))
		switch {
		case b.target != 0:
		case onLat.Count == 0 || offLat.Count == 0:
			sec.Checks = append(sec.Checks, targetBuildBeside.Missed(fmt.Sprintf("%s: %d live events counted running, %d held; the build was too short for its phases",
				b.label, onLat.Count, offLat.Count)))
		default:
			sec.AddCheck(targetBuildBeside, onCase, rise)
		}
		h.log.InfoContext(ctx, "blue/green build measured", slog.String("build", b.label), slog.Float64("events_per_s", rate),
			slog.Float64("events_per_s_wall", wall), slog.Float64("p99_running_ms", Ms(onLat.P99)), slog.Float64("p99_held_ms", Ms(offLat.P99)),
			slog.Float64("p99_rise_pct", rise), slog.Duration("paced", paced), slog.Duration("cut_over_held", cutOver))
	}
	sec.Note("each round: %s of live appends with no build; then a new version built beside the active one while the appends go on "+
		"(from position zero over the %s events loaded, until its cut-over), paced by the active version's lag (BuildLagTarget %s), then one "+
		"at full speed. During each build the build runs for %s, then is held for %s (its batches wait before they start, as its pacing makes them), in "+
		"turn; the live events appended while it runs are compared to those appended while it is held, within the same build; those "+
		"appended in the first %s after each switch count for neither (the backlog of the phase before drains). The p99 rise is running "+
		"vs held. %d rounds, samples pooled per case; the plain rebuild is the first version's catch-up from zero with no live load; "+
		"the build's events/s counts its history and its cut-over, over the time it ran (running) and from its start to its cut-over (wall)",
		sz.liveDuration, Thousands(int64(sz.blueGreenEvents)), projection.BuildLagTargetDefault, run.phase, run.phase, bgSettle, h.bgRoundCount())
	return nil
}

// bgResult is one build: its catch-up's result and wall time, from the worker's start to the
// cut-over; the time it ran (not held), and when it was held and resumed.
type bgResult struct {
	projection.Result
	took, ran time.Duration
	switches  []bgSwitch
}

// bgSwitch is a build held (running false) or resumed at a time.
type bgSwitch struct {
	at      time.Time
	running bool
}

// split sorts the live samples of a build by whether the build ran or was held when their
// event was appended, leaving out those appended within bgSettle of a switch, before the
// build's start or after its cut-over.
func (r bgResult) split(samples []liveSample) (running, held []time.Duration) {
	if len(r.switches) == 0 {
		return nil, nil
	}
	end := r.switches[0].at.Add(r.took)
	for _, s := range samples {
		if s.appended.After(end) {
			continue
		}
		i, _ := slices.BinarySearchFunc(r.switches, s.appended, func(sw bgSwitch, t time.Time) int { return sw.at.Compare(t) })
		// switches[i-1] is the last switch at or before the append (i is the first after it).
		if i == 0 || s.appended.Sub(r.switches[i-1].at) < bgSettle {
			continue
		}
		if r.switches[i-1].running {
			running = append(running, s.latency)
		} else {
			held = append(held, s.latency)
		}
	}
	return running, held
}

// deployFirst runs a worker of version 1, the first version (active at once), and returns its
// catch-up from zero over the store: the plain rebuild.
func (r *bgRun) deployFirst(ctx context.Context) (bgResult, error) {
	p, err := bgProjection(1, 0, &r.rec)
	if err != nil {
		return bgResult{}, err
	}
	runner, err := r.newRunner(p, nil, nil)
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
	return bgResult{Result: res, took: took, ran: took}, nil
}

// deployNext deploys the next version beside the active one, paced by target, holds and
// resumes its build in turn (toggle) until its cut-over, calls done and stops the worker of
// the version it replaced.
func (r *bgRun) deployNext(ctx context.Context, target time.Duration, done func()) (bgResult, error) {
	version := r.active + 1
	p, err := bgProjection(version, target, &r.rec)
	if err != nil {
		return bgResult{}, err
	}
	var (
		mu        sync.Mutex
		res       bgResult
		activated = make(chan struct{})
		gate      = newBgGate()
		started   = time.Now()
	)
	runner, err := r.newRunner(p, func(cu projection.Result) {
		mu.Lock()
		defer mu.Unlock()
		res.Events, res.Paced = res.Events+cu.Events, res.Paced+cu.Paced
		if cu.Activated && !res.Activated {
			res.Activated, res.CutOverHeld, res.took = true, cu.CutOverHeld, time.Since(started)
			close(activated)
		}
	}, gate)
	if err != nil {
		return bgResult{}, err
	}
	if err := r.start(ctx, version, runner); err != nil {
		return bgResult{}, err
	}
	switches, err := r.toggle(ctx, gate, started, activated)
	done()
	if err != nil {
		return bgResult{}, fmt.Errorf("version %d: %w", version, err)
	}
	if err := r.stop(r.active); err != nil {
		return bgResult{}, err
	}
	r.active = version
	mu.Lock()
	defer mu.Unlock()
	res.switches = switches
	end := started.Add(res.took)
	for i, sw := range switches {
		if sw.running {
			next := end
			if i+1 < len(switches) {
				next = switches[i+1].at
			}
			res.ran += max(next.Sub(sw.at), 0)
		}
	}
	if res.Events < r.history {
		return res, fmt.Errorf("version %d handled %d events before its cut-over, want at least %d", version, res.Events, r.history)
	}
	return res, nil
}

// toggle lets the build run for a phase, then holds it (gate) for a phase, in turn, until
// activated closes (its cut-over), and returns the switches, the first its start. A hold
// takes effect when the build's batch in flight commits, so its switch is noted then. The
// cut-over waits at the gate too: it runs in a phase the build runs.
func (r *bgRun) toggle(ctx context.Context, gate *bgGate, started time.Time, activated <-chan struct{}) ([]bgSwitch, error) {
	defer gate.release()
	switches := []bgSwitch{{at: started, running: true}}
	deadline := time.NewTimer(10 * time.Minute)
	defer deadline.Stop()
	phase := time.NewTimer(r.phase)
	defer phase.Stop()
	for running := true; ; running = !running {
		select {
		case <-activated:
			return switches, nil
		case <-deadline.C:
			return switches, errors.New("no cut-over within 10 minutes")
		case <-ctx.Done():
			return switches, ctx.Err()
		case <-phase.C:
		}
		if running {
			gate.hold()
		} else {
			gate.release()
		}
		switches = append(switches, bgSwitch{at: time.Now(), running: !running})
		phase.Reset(r.phase)
	}
}

// newRunner registers p with a runner whose batch reports go to the current recorder, and
// whose catch-ups go to onCatchUp, if set; with gate, if set, holding its batches.
func (r *bgRun) newRunner(p *projection.Projection, onCatchUp func(projection.Result), gate *bgGate) (*projection.Runner, error) {
	cfg := projection.RunnerConfig{Logger: r.h.libLog, OnBatch: func(b projection.BatchReport) {
		if rec := r.rec.Load(); rec != nil {
			rec.onBatch(b)
		}
	}}
	if onCatchUp != nil {
		cfg.OnCatchUp = func(_ string, res projection.Result, _ error) { onCatchUp(res) }
	}
	var backend projection.Backend = r.f.backend
	if gate != nil {
		backend, cfg.NowFunc = gatedBackend{Backend: backend, gate: gate}, gate.now
	}
	runner, err := projection.NewRunner(backend, cfg, p)
	if err != nil {
		return nil, err
	}
	return runner, runner.Init(context.Background())
}

// bgGate holds the batches of a build between two of them, as its pacing does, but for as
// long as the bench says: a held build has no transaction open, reads nothing and sends no
// statement (the live triggers that reach its worker wait for its catch-up in progress), so
// the live projection runs as if there were no build. (Runner.Pause would hold it too, but
// ends its catch-up: every live trigger then starts one more, a transaction that finds the
// version paused — a thousand a second, a load of their own.)
//
// Its clock (the runner's NowFunc) stops while the build is held, so the batch that waited
// does not count the hold in its duration, by which the build is paced.
type bgGate struct {
	mu       sync.Mutex
	held     bool
	open     chan struct{} // closed while not held
	heldAt   time.Time     // the current hold's start
	heldFor  time.Duration // the holds before it, in all
	inFlight int           // batches running
	idle     *sync.Cond    // signalled when inFlight drops to zero
}

func newBgGate() *bgGate {
	g := &bgGate{open: make(chan struct{})}
	close(g.open)
	g.idle = sync.NewCond(&g.mu)
	return g
}

// hold holds the batches not yet started and returns when none is running.
func (g *bgGate) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.held {
		g.held, g.open, g.heldAt = true, make(chan struct{}), time.Now()
	}
	for g.inFlight > 0 {
		g.idle.Wait()
	}
}

// release lets the held batches run.
func (g *bgGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held {
		g.held, g.heldFor = false, g.heldFor+time.Since(g.heldAt)
		close(g.open)
	}
}

// enter waits until the gate is open and counts a batch in; leave counts it out.
func (g *bgGate) enter(ctx context.Context) error {
	for {
		g.mu.Lock()
		open := g.open
		if !g.held {
			g.inFlight++
			g.mu.Unlock()
			return nil
		}
		g.mu.Unlock()
		select {
		case <-open:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (g *bgGate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inFlight--; g.inFlight == 0 {
		g.idle.Broadcast()
	}
}

// now is the time with the holds taken out: it stands still while the build is held.
func (g *bgGate) now() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held {
		return g.heldAt.Add(-g.heldFor)
	}
	return time.Now().Add(-g.heldFor)
}

// gatedBackend is a projection backend whose batches, and cut-over, wait at gate before they
// start.
type gatedBackend struct {
	projection.Backend
	gate *bgGate
}

func (b gatedBackend) Activate(ctx context.Context, p *projection.Projection, co projection.CutOver, hook projection.HookFunc) (projection.Activation, error) {
	if err := b.gate.enter(ctx); err != nil {
		return projection.Activation{}, err
	}
	defer b.gate.leave()
	return b.Backend.Activate(ctx, p, co, hook)
}

func (b gatedBackend) RunBatch(ctx context.Context, p *projection.Projection, fn projection.BatchFunc) error {
	if err := b.gate.enter(ctx); err != nil {
		return err
	}
	defer b.gate.leave()
	return b.Backend.RunBatch(ctx, p, fn)
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
	return rec.timedSamples(), nil
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
