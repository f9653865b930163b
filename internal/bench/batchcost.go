package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgeworks/nudge/eventstore"
	espg "github.com/nudgeworks/nudge/eventstore/postgres"
	"github.com/nudgeworks/nudge/internal/backoff"
	"github.com/nudgeworks/nudge/projection"
)

// batchCostChildEnv, when set, makes the bench binary measure what a batch costs the library
// it was built from (batchCostSpec in, batchCostFigures out as JSON on stdout) instead of the
// benchmarks: the batchcost scenario runs this tree's binary and the baseline's in turn.
const batchCostChildEnv = "NUDGE_BENCH_BATCHCOST"

// batchCostBaselineDefault is the tree the batchcost scenario measures beside this one by
// default: the library before its batches read their state in one statement (issue 40's
// "today's tree").
const batchCostBaselineDefault = "2d4988e"

// The batchcost scenario's targets: a batch's fixed cost at a third of the baseline's, and ten
// projections at 1,000 appends/s leaving the two cores room.
var (
	targetBatchCost = Target{Name: "PostgreSQL CPU per batch of one event over the baseline tree's", Op: AtMost, Threshold: 0.34, Unit: "×"}
	targetBatchLive = Target{Name: "PostgreSQL CPU per event × projection (without the appends) at 10 projections, 1,000 appends/s, over the baseline tree's", Op: AtMost, Threshold: 0.34, Unit: "×"}
	targetLiveCores = Target{Name: "cores busy on the whole machine (/proc/stat: PostgreSQL, RabbitMQ, the process, anything else) at 10 projections, 1,000 appends/s", Op: AtMost, Threshold: 1.6, Unit: "cores"}
)

// batchCostSpec is what a batchcost child measures.
type batchCostSpec struct {
	PostgresURL string  `json:"postgres_url"`
	AMQPURL     string  `json:"amqp_url"`
	Batches     int     `json:"batches"`
	LiveRate    int     `json:"live_rate"`
	LiveSeconds float64 `json:"live_seconds"`
	Projections int     `json:"projections"`
}

// batchCostFigures are one child's measurements.
type batchCostFigures struct {
	// OneEventUS and EmptyUS are the server backend's CPU per batch, in µs: a catch-up of one
	// event (read, one upsert, the position's advance, commit), and one that finds nothing.
	OneEventUS float64 `json:"one_event_us"`
	EmptyUS    float64 `json:"empty_us"`
	// BackToBackUS is the backend's CPU per batch of one event when the batches follow each
	// other at once (a catch-up with BatchSize 1 over the events appended before it): without
	// the backend's idle wait before each batch.
	BackToBackUS float64 `json:"back_to_back_us"`
	// OneEventSyncUS is OneEventUS with projection.Config.SynchronousCommit: the commit waits
	// for its WAL flush (a library without the field commits every batch so).
	OneEventSyncUS float64 `json:"one_event_sync_us"`
	// ByHandUS is BackToBackUS for a batch written by hand (byHandBatches): the same work
	// without the library — the floor of what a batch can cost this server.
	ByHandUS float64 `json:"by_hand_us"`
	// The live run: the server backends' CPU per event × projection (µs), and per batch
	// without the writers' backends, the appends/s reached, the cores busy (the backends' and this process's CPU over the
	// window), the live p99 (ms) and the batches per second.
	LivePerEventProjectionUS float64 `json:"live_per_event_projection_us"`
	// LiveProjectionsUS is LivePerEventProjectionUS without the writers' backends: what the
	// projections (and the relay) cost the server per event × projection, the appends left out.
	LiveProjectionsUS float64 `json:"live_projections_us"`
	LivePerBatchUS    float64 `json:"live_per_batch_us"`
	LiveAppendsPerS   float64 `json:"live_appends_per_s"`
	LiveCores         float64 `json:"live_cores"`
	// LiveMachineCores is the whole machine's busy cores over the live window (/proc/stat): the
	// broker's and everything else's included.
	LiveMachineCores float64 `json:"live_machine_cores"`
	LiveP99Ms        float64 `json:"live_p99_ms"`
	LiveBatchesPerS  float64 `json:"live_batches_per_s"`
}

// batchCostFigure names one figure of batchCostFigures for the page.
type batchCostFigure struct {
	name, unit string
	get        func(batchCostFigures) float64
}

var batchCostFigureList = []batchCostFigure{
	{"pg_cpu_us_per_batch_one_event", "µs", func(f batchCostFigures) float64 { return f.OneEventUS }},
	{"pg_cpu_us_per_batch_one_event_synchronous_commit", "µs", func(f batchCostFigures) float64 { return f.OneEventSyncUS }},
	{"pg_cpu_us_per_empty_batch", "µs", func(f batchCostFigures) float64 { return f.EmptyUS }},
	{"pg_cpu_us_per_batch_one_event_back_to_back", "µs", func(f batchCostFigures) float64 { return f.BackToBackUS }},
	{"pg_cpu_us_per_batch_one_event_by_hand", "µs", func(f batchCostFigures) float64 { return f.ByHandUS }},
	{"pg_cpu_batch_back_to_back_over_by_hand", "×", func(f batchCostFigures) float64 { return Ratio(f.BackToBackUS, f.ByHandUS) }},
	{"live_pg_cpu_us_per_event_projection", "µs", func(f batchCostFigures) float64 { return f.LivePerEventProjectionUS }},
	{"live_pg_cpu_us_per_event_projection_without_appends", "µs", func(f batchCostFigures) float64 { return f.LiveProjectionsUS }},
	{"live_pg_cpu_us_per_batch", "µs", func(f batchCostFigures) float64 { return f.LivePerBatchUS }},
	{"live_cores", "cores", func(f batchCostFigures) float64 { return f.LiveCores }},
	{"live_machine_cores", "cores", func(f batchCostFigures) float64 { return f.LiveMachineCores }},
	{"live_appends_per_s", "appends/s", func(f batchCostFigures) float64 { return f.LiveAppendsPerS }},
	{"live_p99_ms", "ms", func(f batchCostFigures) float64 { return f.LiveP99Ms }},
	{"live_batches_per_s", "batches/s", func(f batchCostFigures) float64 { return f.LiveBatchesPerS }},
}

// runBatchCost measures what a batch costs the server, in this tree and in the baseline tree
// (-batchcost-baseline), each in a child process of its own build, in alternating rounds:
// the per-batch CPU of one backend running catch-ups of one event and empty ones, and a live
// run of ten projections at 1,000 appends/s on RabbitMQ.
func runBatchCost(ctx context.Context, h *harness, sec *Section) error {
	sz := h.sizes
	spec := batchCostSpec{PostgresURL: h.opts.postgresURL, AMQPURL: h.opts.amqpURL, Batches: sz.batchCostBatches,
		LiveRate: sz.liveRate, LiveSeconds: sz.batchCostLive.Seconds(), Projections: fleetBase}
	sec.Params["batches"], sec.Params["live_rate_per_s"], sec.Params["live_window_s"] = spec.Batches, spec.LiveRate, spec.LiveSeconds
	sec.Params["projections"], sec.Params["rounds"], sec.Params["baseline"] = spec.Projections, sz.batchCostRounds, h.opts.batchCostBaseline
	current, err := os.Executable()
	if err != nil {
		return err
	}
	baseline, cleanup, err := buildBaseline(ctx, h.opts.batchCostBaseline)
	if err != nil {
		return fmt.Errorf("build the baseline tree %s: %w", h.opts.batchCostBaseline, err)
	}
	defer cleanup()
	var mine, theirs []batchCostFigures
	for round := range sz.batchCostRounds {
		order := []string{current, baseline}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, exe := range order {
			f, err := runBatchCostChild(ctx, exe, spec)
			if err != nil && ctx.Err() == nil { // a busy machine's broker may refuse a connection a while: once more
				h.log.WarnContext(ctx, "batchcost round failed; running it again", slog.Int("round", round+1), slog.Any("error", err))
				f, err = runBatchCostChild(ctx, exe, spec)
			}
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round+1, map[bool]string{true: "this tree", false: "baseline"}[exe == current], err)
			}
			if exe == current {
				mine = append(mine, f)
			} else {
				theirs = append(theirs, f)
			}
			h.log.InfoContext(ctx, "batchcost round", slog.Int("round", round+1), slog.Bool("this_tree", exe == current),
				slog.Float64("one_event_us", f.OneEventUS), slog.Float64("live_us_per_event_projection", f.LivePerEventProjectionUS),
				slog.Float64("live_cores", f.LiveCores))
		}
	}
	baseCase := "baseline tree " + h.opts.batchCostBaseline
	table := &Table{Header: []string{"figure", "this tree", "baseline tree", "ratio"}}
	sec.table = table
	for _, fig := range batchCostFigureList {
		now, before := medianOf(mine, fig.get), medianOf(theirs, fig.get)
		sec.AddMetric(Metric{Case: baseCase, Name: fig.name, Unit: fig.unit, Value: before})
		m := Metric{Case: "this tree", Name: fig.name, Unit: fig.unit, Value: now}.WithBaseline(baseCase, before)
		sec.AddMetric(m)
		table.Add(fig.name, FormatValue(now, fig.unit), FormatValue(before, fig.unit), FormatValue(m.Ratio, "×"))
		switch fig.name {
		case "pg_cpu_us_per_batch_one_event":
			sec.AddCheck(targetBatchCost, "this tree", m.Ratio)
		case "live_pg_cpu_us_per_event_projection_without_appends":
			sec.AddCheck(targetBatchLive, "this tree", m.Ratio)
		case "live_machine_cores":
			sec.AddCheck(targetLiveCores, "this tree", now)
		}
	}
	sec.Note("each figure the median of %d rounds; a round runs this tree's build, then the baseline's (the order alternates), each in a process and databases of its own; the baseline is the library at %s built with this tree's bench harness", sz.batchCostRounds, h.opts.batchCostBaseline)
	sec.Note("per batch: one backend's CPU (/proc/<pid>/stat) over %d catch-ups of one projection (OnQueued, one upsert per event), each after one append, and over %d catch-ups that find nothing; back to back: a catch-up in batches of one event (BatchSize 1) over every event appended so far, the backend never idle between batches; by hand: the same batches written without the library (BEGIN, an advisory lock, the position's row and the next event bounded by the snapshot's xmin in one round trip; the upsert, the position's update and COMMIT in a second; asynchronous commit) on the same connection, the floor of a batch's cost on this server, run by each tree's child alike; the same with projection.Config.SynchronousCommit, whose commit waits for the WAL flush (the baseline has no such setting: its batches always commit so)", spec.Batches, spec.Batches)
	sec.Note("live: %d projections (the fleet scenario's) at %d appends/s on RabbitMQ, one worker, %.0f s measured: the server backends' CPU per event × projection, all of them and without the writers' (application_name %s: the appends), and per committed batch (without the writers'); cores: the backends' CPU and this process's over the window; machine cores: every core's busy time over the window (/proc/stat), the broker's and any other work on the machine included", spec.Projections, spec.LiveRate, spec.LiveSeconds, writersApplication)
	return nil
}

// medianOf returns the median of get over figs.
func medianOf(figs []batchCostFigures, get func(batchCostFigures) float64) float64 {
	vals := make([]float64, len(figs))
	for i, f := range figs {
		vals[i] = get(f)
	}
	slices.Sort(vals)
	if len(vals) == 0 {
		return 0
	}
	if len(vals)%2 == 1 {
		return vals[len(vals)/2]
	}
	return (vals[len(vals)/2-1] + vals[len(vals)/2]) / 2
}

// buildBaseline builds the bench binary of rev's library with this tree's harness: rev's files
// (git archive) with internal/bench replaced by this tree's. It returns the binary and a
// function that removes the build.
func buildBaseline(ctx context.Context, rev string) (string, func(), error) {
	top, err := exec.CommandContext(ctx, "git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", nil, fmt.Errorf("find the repository (run from its checkout): %w", err)
	}
	root := strings.TrimSpace(string(top))
	dir, err := os.MkdirTemp("", "nudge-bench-baseline-")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	archive := exec.CommandContext(ctx, "git", "-C", root, "archive", "--format=tar", rev)
	var tarball bytes.Buffer
	archive.Stdout, archive.Stderr = &tarball, os.Stderr
	if err := archive.Run(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("git archive %s (a shallow clone may lack it; set -batchcost-baseline): %w", rev, err)
	}
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", dir)
	untar.Stdin = &tarball
	if out, err := untar.CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("unpack: %w: %s", err, out)
	}
	harness := filepath.Join(dir, "internal", "bench")
	if err := os.RemoveAll(harness); err != nil {
		cleanup()
		return "", nil, err
	}
	if err := copyHarness(filepath.Join(root, "internal", "bench"), harness); err != nil {
		cleanup()
		return "", nil, err
	}
	exe := filepath.Join(dir, "bench-baseline")
	build := exec.CommandContext(ctx, "go", "build", "-o", exe, "./internal/bench")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("go build: %w: %s", err, out)
	}
	return exe, cleanup, nil
}

// copyHarness copies the harness's Go files (not its tests) from src to dst.
func copyHarness(src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// runBatchCostChild runs exe as a batchcost child and returns its figures.
func runBatchCostChild(ctx context.Context, exe string, spec batchCostSpec) (batchCostFigures, error) {
	raw, err := json.Marshal(spec)
	if err != nil {
		return batchCostFigures{}, err
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), batchCostChildEnv+"="+string(raw))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return batchCostFigures{}, fmt.Errorf("%w: %s", err, tail(stderr.String(), 2000))
	}
	var f batchCostFigures
	if err := json.Unmarshal(stdout.Bytes(), &f); err != nil {
		return f, fmt.Errorf("read its figures: %w: %q", err, tail(stdout.String(), 500))
	}
	return f, nil
}

// runBatchCostMeasure is a batchcost child: it measures spec and writes the figures to stdout
// as JSON; it returns the exit code.
func runBatchCostMeasure(raw string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var spec batchCostSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		log.Error("batchcost: bad spec", slog.Any("error", err))
		return 2
	}
	out, err := os.MkdirTemp("", "nudge-bench-batchcost-")
	if err != nil {
		log.Error("batchcost", slog.Any("error", err))
		return 1
	}
	defer func() { _ = os.RemoveAll(out) }()
	opts, err := parseFlags([]string{"-postgres", spec.PostgresURL, "-amqp", spec.AMQPURL, "-out", out}, io.Discard)
	if err != nil {
		log.Error("batchcost", slog.Any("error", err))
		return 2
	}
	ctx := context.Background()
	h, err := newHarness(ctx, opts, log, slog.New(slog.DiscardHandler))
	if err != nil {
		log.Error("batchcost", slog.Any("error", err))
		return 1
	}
	defer h.close()
	figs, err := h.measureBatchCost(ctx, spec)
	if err != nil {
		log.Error("batchcost", slog.Any("error", err))
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(figs); err != nil {
		return 1
	}
	return 0
}

// measureBatchCost measures spec with the library this binary was built from.
func (h *harness) measureBatchCost(ctx context.Context, spec batchCostSpec) (batchCostFigures, error) {
	var figs batchCostFigures
	var err error
	var per batchCPU
	if per, err = h.perBatchCPU(ctx, spec.Batches, false); err != nil {
		return figs, fmt.Errorf("per batch: %w", err)
	}
	figs.OneEventUS, figs.EmptyUS, figs.BackToBackUS, figs.ByHandUS = per.oneEvent, per.empty, per.backToBack, per.byHand
	if per, err = h.perBatchCPU(ctx, spec.Batches, true); err != nil {
		return figs, fmt.Errorf("per batch, synchronous commit: %w", err)
	}
	figs.OneEventSyncUS = per.oneEvent
	h.sizes.fleetRate, h.sizes.fleetDuration = spec.LiveRate, time.Duration(spec.LiveSeconds*float64(time.Second))
	fig, err := h.fleetRun(ctx, fleetCase{channel: chAMQP, projections: spec.Projections, workers: 1})
	if err != nil {
		return figs, fmt.Errorf("live: %w", err)
	}
	figs.LivePerEventProjectionUS = fig.perEventProjection(spec.Projections)
	figs.LiveProjectionsUS = Ratio(float64((fig.pgCPU - fig.writersCPU).Microseconds()), float64(fig.appended*spec.Projections))
	figs.LivePerBatchUS = Ratio(float64((fig.pgCPU - fig.writersCPU).Microseconds()), float64(fig.batches))
	figs.LiveAppendsPerS = fig.appendsPerS
	figs.LiveCores = Ratio((fig.pgCPU + fig.processCPU).Seconds(), fig.seconds)
	figs.LiveMachineCores = Ratio(fig.machineBusy.Seconds(), fig.seconds)
	figs.LiveP99Ms = Ms(fig.latency.P99)
	figs.LiveBatchesPerS = Ratio(float64(fig.batches), fig.seconds)
	return figs, nil
}

// batchCPU is one server backend's CPU per batch, in µs (perBatchCPU).
type batchCPU struct {
	oneEvent, empty, backToBack, byHand float64
}

// perBatchCPU returns one server backend's CPU per batch (µs) over n catch-ups of one event
// each, each after an append; then over n catch-ups that find nothing; then per batch of a
// catch-up of every event so far in batches of one (backToBack); then per batch of the same
// written by hand (byHandBatches). With synchronous, the projections' batches wait for their
// commit's WAL flush (setSynchronousCommit).
func (h *harness) perBatchCPU(ctx context.Context, n int, synchronous bool) (batchCPU, error) {
	var out batchCPU
	f, err := h.newFixture(ctx, 1) // the runner's store and backend: one connection, one backend
	if err != nil {
		return out, err
	}
	defer f.close()
	appends, err := f.db.newPool(ctx, 2)
	if err != nil {
		return out, err
	}
	writer, err := espg.New(appends, espg.Config{})
	if err != nil {
		return out, err
	}
	cfg := projection.Config{
		InitFunc: func(ctx context.Context, p projection.HookParams) error {
			_, err := p.Tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS batchcost (stream_id text PRIMARY KEY, version bigint NOT NULL)`)
			return err
		},
	}
	if synchronous {
		setSynchronousCommit(&cfg)
	}
	upsert := projection.OnQueued(batchCostEventType, func(_ context.Context, q *projection.Queue, e projection.Event[json.RawMessage]) error {
		q.Queue(`INSERT INTO batchcost (stream_id, version) VALUES ($1, $2) ON CONFLICT (stream_id) DO UPDATE SET version = EXCLUDED.version`,
			e.StreamID, e.StreamVersion)
		return nil
	})
	p, err := projection.New("batchcost", cfg, upsert)
	if err != nil {
		return out, err
	}
	cfg.BatchSize = 1
	ones, err := projection.New("batchcost_ones", cfg, upsert)
	if err != nil {
		return out, err
	}
	runner, err := projection.NewRunner(f.backend, projection.RunnerConfig{Logger: slog.New(slog.DiscardHandler)}, p, ones)
	if err != nil {
		return out, err
	}
	if err := runner.Init(ctx); err != nil {
		return out, err
	}
	cpu := func() (time.Duration, error) { return poolBackendCPU(ctx, f.db.pool) }
	// Warm up: the statements prepared, the plans cached.
	for i := range 50 {
		if err := appendAndCatchUp(ctx, writer, runner, i); err != nil {
			return out, err
		}
	}
	before, err := cpu()
	if err != nil {
		return out, err
	}
	for i := range n {
		if err := appendAndCatchUp(ctx, writer, runner, i); err != nil {
			return out, err
		}
	}
	mid, err := cpu()
	if err != nil {
		return out, err
	}
	for range n {
		if _, err := runner.CatchUp(ctx, p.Name()); err != nil {
			return out, err
		}
	}
	after, err := cpu()
	if err != nil {
		return out, err
	}
	batches, events := 0, 0
	for events < n+50 { // every event so far, one a batch, the batches back to back
		res, err := runner.CatchUp(ctx, ones.Name())
		if err != nil {
			return out, err
		}
		if res.Events == 0 {
			return out, fmt.Errorf("the back-to-back catch-up stopped at %d of %d events", events, n+50)
		}
		batches, events = batches+res.Batches, events+res.Events
	}
	last, err := cpu()
	if err != nil {
		return out, err
	}
	var rows int
	if err := f.db.pool.QueryRow(ctx, `SELECT count(*) FROM batchcost`).Scan(&rows); err != nil {
		return out, err
	}
	if rows != batchCostStreams {
		return out, fmt.Errorf("the read model holds %d streams, want %d", rows, batchCostStreams)
	}
	if out.byHand, err = byHandBatches(ctx, f.db.pool, n+50, !synchronous); err != nil {
		return out, fmt.Errorf("by hand: %w", err)
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	out.oneEvent, out.empty = per(mid-before), per(after-mid)
	out.backToBack = Ratio(float64((last - after).Microseconds()), float64(batches))
	return out, nil
}

// setSynchronousCommit sets cfg.SynchronousCommit where the library built has the field: the
// harness is built with the baseline's library too, whose batches always commit
// synchronously.
func setSynchronousCommit(cfg *projection.Config) {
	if f := reflect.ValueOf(cfg).Elem().FieldByName("SynchronousCommit"); f.IsValid() {
		f.SetBool(true)
	}
}

// batchCostStreams are the streams perBatchCPU appends to, in turn; batchCostEventType their
// events' type.
const (
	batchCostStreams   = 50
	batchCostEventType = "TicketWasUpdated"
)

// appendAndCatchUp appends event i and catches the projection up: one batch of one event.
func appendAndCatchUp(ctx context.Context, writer *espg.Store, runner *projection.Runner, i int) error {
	stream := fmt.Sprintf("batchcost-%d", i%batchCostStreams)
	appended, err := writer.Append(ctx, stream, eventstore.Any, eventstore.EventData{Type: batchCostEventType, Payload: json.RawMessage(`{"w":0,"n":1}`)})
	if err != nil {
		return err
	}
	// A transaction elsewhere in the cluster may hold the horizon a moment: the batch is to
	// find its event. The wait reads on the writer's pool, not the measured backend.
	for {
		head, err := writer.Head(ctx)
		if err != nil {
			return err
		}
		if !head.Less(appended.Events[0].Position) {
			break
		}
		if err := backoff.Sleep(ctx, time.Millisecond); err != nil {
			return err
		}
	}
	// Another database's transaction in its commit window may still hold this store's horizon
	// below the event for a moment (the writer's store saw past it; the runner's has a floor of
	// its own): the batch then finds nothing, and the next one finds the event. Such empty
	// batches are rare, and counted in with the event's.
	for tries := 0; ; tries++ {
		res, err := runner.CatchUp(ctx, "batchcost")
		if err != nil {
			return err
		}
		switch {
		case res.Events == 1:
			return nil
		case res.Events > 1 || tries == 100:
			return fmt.Errorf("catch-up %d handled %d events, want 1", i, res.Events)
		}
		if err := backoff.Sleep(ctx, time.Millisecond); err != nil {
			return err
		}
	}
}

// poolBackendCPU returns the CPU so far of the server backend of pool's one connection.
func poolBackendCPU(ctx context.Context, pool *pgxpool.Pool) (time.Duration, error) {
	var pid int32
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return 0, err
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, errors.New("the server's backends are not on this machine: the batch cost needs /proc of the server")
		}
		return 0, err
	}
	return parseStatCPU(data)
}

// byHandBatches runs batches of one event written by hand, back to back, on the one
// connection of pool, and returns its backend's CPU per batch (µs) over all but the first 50 of
// events batches: the work of a batch without the library — in one round trip BEGIN, an
// advisory lock, the position's row and the next event (bounded by the snapshot's xmin; of any
// type: the store holds only the projection's); in a
// second the read model's upsert, the position's update and COMMIT. With async, the lock's
// statement makes the commit asynchronous, as the library's batches do (batchMode). The
// position and the read model are tables of its own, so it measures the same work beside any
// tree's library.
func byHandBatches(ctx context.Context, pool *pgxpool.Pool, events int, async bool) (float64, error) {
	const warmUp = 50
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS batchcost_hand (stream_id text PRIMARY KEY, version bigint NOT NULL);
		CREATE TABLE IF NOT EXISTS batchcost_hand_position (name text PRIMARY KEY, transaction_id xid8 NOT NULL, global_position bigint NOT NULL,
			events_processed bigint NOT NULL, updated_at timestamptz NOT NULL);
		INSERT INTO batchcost_hand_position VALUES ('hand', '0', 0, 0, now()) ON CONFLICT (name) DO NOTHING`); err != nil {
		return 0, err
	}
	var pid int32
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return 0, err
	}
	cpu := func() (time.Duration, error) {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, err
		}
		return parseStatCPU(data)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	lock := `SELECT pg_advisory_xact_lock(1, hashtext($1))`
	if async {
		lock += `, set_config('synchronous_commit', 'off', true)`
	}
	var (
		tx        uint64
		pos       int64
		start     time.Duration
		stream    string
		version   int64
		processed int64
	)
	for i := range events {
		if i == warmUp {
			if start, err = cpu(); err != nil {
				return 0, err
			}
		}
		found := false
		var read pgx.Batch
		read.Queue(`BEGIN ISOLATION LEVEL READ COMMITTED`)
		read.Queue(lock, "hand")
		read.Queue(`SELECT events_processed FROM batchcost_hand_position WHERE name = $1`, "hand").QueryRow(func(row pgx.Row) error {
			return row.Scan(&processed)
		})
		read.Queue(`SELECT global_position, transaction_id, stream_id, stream_version, payload FROM nudge_events
			WHERE (transaction_id, global_position) > ($1::xid8, $2::bigint) AND transaction_id < pg_snapshot_xmin(pg_current_snapshot())
			ORDER BY transaction_id, global_position LIMIT 1`, tx, pos).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var payload []byte
				if err := rows.Scan(&pos, &tx, &stream, &version, &payload); err != nil {
					return err
				}
				found = true
			}
			return rows.Err()
		})
		if err := conn.SendBatch(ctx, &read).Close(); err != nil {
			return 0, err
		}
		if !found {
			_, _ = conn.Exec(ctx, `ROLLBACK`)
			return 0, fmt.Errorf("batch %d of %d found no event", i+1, events)
		}
		var write pgx.Batch
		write.Queue(`INSERT INTO batchcost_hand (stream_id, version) VALUES ($1, $2) ON CONFLICT (stream_id) DO UPDATE SET version = EXCLUDED.version`, stream, version)
		write.Queue(`UPDATE batchcost_hand_position SET transaction_id = $2, global_position = $3, events_processed = events_processed + 1, updated_at = now() WHERE name = $1`,
			"hand", tx, pos)
		write.Queue(`COMMIT`)
		if err := conn.SendBatch(ctx, &write).Close(); err != nil {
			return 0, err
		}
	}
	end, err := cpu()
	if err != nil {
		return 0, err
	}
	return Ratio(float64((end - start).Microseconds()), float64(events-warmUp)), nil
}
