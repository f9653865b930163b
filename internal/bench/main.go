// Command bench measures nudge against real PostgreSQL and RabbitMQ and prints every figure
// beside a baseline measured in the same run, with the ratio and the project's targets
// (PASS/MISS with the gap). It also writes the results as JSON, with the machine they were
// measured on, to -out.
//
//	go run ./internal/bench [-quick] [-scenario all|rebuild|latency|append|idle|fanout|recovery|park|dlstall|bluegreen|status|horizon|partitions|cqrs|scaleout|console|fleet|deep|batchcost]
//	                        [-out bench-results] [-cpuprofile] [-pprof-dir DIR]
//	                        [-write-docs docs/performance.md] [-from-json FILE]
//
// Scenarios (several may be given, comma-separated):
//
//   - rebuild: rebuild a ticket_list read model from position zero over events loaded with COPY,
//     with per-event handlers (projection.On, projection.OnQueued) and a set-based flush hook,
//     at batch size 1000 (-quick: 500 and 1000; On over the first tenth of the events, the
//     others over the first quarter), beside the naive loop (one transaction per
//     event) and the database's own limit (one INSERT … SELECT over all events); peak RSS
//     during each rebuild. The events are loaded once per run and copied for bluegreen.
//   - latency: from append commit to read model visible, at a steady append rate, with 1 and 10
//     projections on each channel, beside the channel's bare publish-to-consume hop.
//   - append: append throughput with trigger publishing on each channel beside the bare store,
//     in interleaved runs.
//   - idle: what 10 idle projections on the PostgreSQL queue, fed by a relay, cost the server
//     (transactions per second, pg_stat_database), polled only (-no-listen) beside woken by
//     LISTEN/NOTIFY.
//   - fanout: 1, 10 and 50 projections catching up on one worker; and whether one slow
//     projection raises the others' live latency.
//   - recovery: a projection stuck on a poison event while events arrive; time until caught up
//     after the fix and one dead-letter replay, beside a plain catch-up of the same events.
//   - park: the other streams' live latency on RabbitMQ with one stream parked
//     (OnFailure park) against none, side by side.
//   - dlstall: healthy projections' live latency on RabbitMQ with their worker's dead-letter
//     store partitioned (a proxy that accepts and forwards nothing) against projections of a
//     worker whose store answers, side by side.
//   - bluegreen: a new version of a projection built beside the active one over the loaded
//     events (the rebuild's size) while live appends go on, paced by the live lag to its
//     cut-over, then one at full speed for a bounded window, between two windows with no
//     build: the active projection's live p99 during each build against no build, and the
//     builds' throughput beside a plain rebuild.
//   - status: reading the status of 10 projections, each the whole store (1,000,000 events of
//     a few types) behind: Backend.Statuses and a metrics scrape (WatchRunner, Gather), beside
//     the exact lag count in SQL the library used to run; and whether the lag is exact.
//   - horizon: read throughput (store.Read, limit 500, one connection) and the cost of the
//     read horizon alone, with and without 200 more connections on the server (150 idle, 50
//     holding exempt writing transactions, which the horizon finds in pg_locks); fewer, in
//     the same ratio, when max_connections leaves no room for 200.
//   - partitions: the whole log (200,000 events) read to its end in pages of 1,000 by one
//     reader, and by 16 concurrent readers of one partition each (ReadOptions.Partition,
//     through the index of Store.EnsurePartitions): wall time and the work on the events table
//     (blocks, heap and index tuples from pg_statio/pg_stat deltas); what a stored hash column
//     would have cost to add, and append throughput without and with the partition index.
//   - cqrs: beside Watermill's CQRS event processor (components/cqrs) on RabbitMQ and on
//     watermill-sql's PostgreSQL queue, writing the same read model: live latency, events
//     applied twice and lost when a consumer (a child process) is SIGKILLed between its write
//     and its ack, and events lost when the publish after the store's commit fails.
//   - scaleout: a backlog (30,000 events over 10,000 streams) caught up by a projection whose
//     handler waits 2 ms per event (a remote call: CPU-bound handlers cannot scale on two
//     cores), unpartitioned on one worker and in 16 partitions on 1, 4 and 8 workers in
//     this process (each its own runner, pool and lease membership), timed from the workers'
//     start, lease convergence included; and what partitioning itself costs: the same backlog
//     without the wait, unpartitioned and in 16 partitions on one worker.
//   - console: the operator console's overview (console.New's handler, server time through
//     httptest) of 300 projections, each the whole store (the status scenario's) behind.
//   - fleet: 1, 10, 100 and 300 projections (OnQueued, a small read model each) at 150
//     appends/s, on RabbitMQ and the PostgreSQL queue, on one worker and on four (-quick:
//     RabbitMQ, one worker, 100 appends/s): live p50/p99, the server backends' CPU per event ×
//     projection beside the 10 projections' (the growth), transactions per append, triggers
//     and batches per second, connections and broker queues; then what 300 idle projections
//     cost the server in transactions per second.
//   - deep: a deep store, at each depth of -deep-events (1,000,000 and 20,000,000 events;
//     -quick: 20,000 and 100,000) COPY-loaded into a database of its own and dropped after:
//     the load's and VACUUM's time, Backend.Statuses over 300 projections spread over the log
//     before and after the VACUUM, the table's and each index's size (bytes per event, btree
//     levels, all-visible pages), a projection's catch-up rate from zero (the first 200,000
//     events) and near the end (the last 200,000), single-event append latency p50/p99, and a
//     live projection at the head keeping up with appends; every depth beside the first.
//   - batchcost: what a batch costs the server, for this tree and for the library at
//     -batchcost-baseline (a git revision, built with this tree's harness), each in a process of
//     its own, in alternating rounds (-quick: one): one backend's CPU per batch of one event and
//     per empty batch over 2,000 catch-ups each (-quick: 500), and ten projections at 1,000
//     appends/s on RabbitMQ for 8 s (-quick: 3 s): the server backends' CPU per event ×
//     projection and per batch, the cores busy (backends and process), the appends/s reached
//     and the live p99.
//
// Each scenario step runs on a database of its own (created and dropped, named like
// internal/pgtest's) and a RabbitMQ prefix of its own (named like internal/amqptest's). The
// servers come from -postgres and -amqp, which default to NUDGE_TEST_POSTGRES_URL and
// NUDGE_TEST_AMQP_URL, else the local servers of `make up`.
//
// The terminal shows progress (stderr) and the tables (stdout); the library's own logs go to
// <out>/bench-<start time>.log beside the JSON results (-log-level). With -cpuprofile, each
// scenario's CPU profile of this process goes to -pprof-dir: where a target is missed, `go tool
// pprof` on it shows where the client's time went (the servers' CPU is not in it; Section's
// go_cpu_s says how much of the wall time this process used).
//
// With -write-docs (make bench), the scenarios run are merged into that Markdown page, one
// section each with the machine, the commit and the date; the other scenarios' sections stay,
// and the JSON results are kept in bench/ beside the page. -from-json merges a results file
// into the page without running anything.
//
// The exit code is 0 when every
// scenario ran, whatever the targets say, 1 when one failed, 2 for bad flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	pgchannel "github.com/nudgeworks/nudge/channel/postgres"
	"github.com/nudgeworks/nudge/internal/redact"
	"github.com/nudgeworks/nudge/relay"
)

// Defaults of the server URLs, as in internal/pgtest and internal/amqptest.
const (
	postgresURLDefault = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	amqpURLDefault     = "amqp://guest:guest@127.0.0.1:5672/"
)

// options are the command-line flags.
type options struct {
	quick       bool
	scenarios   []string
	out         string
	cpuProfile  bool
	pprofDir    string
	postgresURL string
	amqpURL     string
	pgPoll      time.Duration
	// relayInterval is the relays' MinInterval.
	relayInterval time.Duration
	// noListen turns LISTEN/NOTIFY wake-ups off: relays and the PostgreSQL queue only poll.
	noListen bool
	// fleetIdleOnly runs only the fleet scenario's idle cases.
	fleetIdleOnly bool
	// liveWarmup is how long live runs append, unmeasured, before their measured window;
	// liveWarmupSet: -live-warmup was given.
	liveWarmup    time.Duration
	liveWarmupSet bool
	logLevel      slog.Level
	// trace turns OpenTelemetry tracing on: every span sampled, exported to memory.
	trace bool
	// writeDocs is the performance page the run's scenarios are merged into; fromJSON, a
	// results file to merge into it instead of running.
	writeDocs, fromJSON string
	// deepEvents are the deep scenario's depths (-deep-events); nil: the sizes' own.
	deepEvents []int
	// batchCostBaseline is the git revision whose library the batchcost scenario measures
	// beside this tree's.
	batchCostBaseline string
}

// scenario is one benchmark scenario.
type scenario struct {
	name  string
	title string
	run   func(ctx context.Context, h *harness, sec *Section) error
	// targets are the targets run checks; those it did not reach are reported as not measured.
	targets []Target
}

// scenarios are run in this order.
var scenarios = []scenario{
	{"rebuild", "rebuild a read model from position zero", runRebuild, rebuildTargets()},
	{"latency", "live latency, append commit to read model visible", runLatency, latencyTargets()},
	{"append", "append throughput with trigger publishing", runAppend, appendTargets()},
	{"idle", "what idle projections cost the server, polled and woken", runIdle, []Target{targetIdleCost}},
	{"fanout", "many projections on one worker", runFanout, []Target{targetSlowProjection}},
	{"recovery", "poison event, fix, one replay", runRecovery, nil},
	{"park", "other streams' live latency with one stream parked", runPark, []Target{targetParkedStream}},
	{"dlstall", "healthy projections' live latency with their dead-letter store stalled", runDeadLetterStall, []Target{targetDeadLetterStall}},
	{"bluegreen", "a new version built beside the live one", runBlueGreen, []Target{targetBuildBeside}},
	{"status", "projection status with a large backlog", runStatus, statusTargets()},
	{"horizon", "the read horizon under many connections", runHorizon, []Target{targetHorizonReads}},
	{"partitions", "reading the log as 16 partitions beside reading it whole", runPartitions, []Target{targetPartitionTuples, targetPartitionBlocks}},
	{"cqrs", "beside Watermill's CQRS event processor", runCQRS, []Target{targetCQRSFaults}},
	{"scaleout", "a partitioned projection's catch-up on 1 to 8 workers", runScaleOut, []Target{targetScaleOut, targetPartitionCost}},
	{"console", "the operator console's overview of 300 projections", runConsole, []Target{targetConsole}},
	{"fleet", "what 1 to 300 projections cost per event and projection, and idle", runFleet, []Target{targetFleetGrowth, targetFleetIdle}},
	{"deep", "a deep store: appends, catch-ups, status and sizes by depth", runDeep, nil},
	{"batchcost", "what a batch costs the server, beside the baseline tree", runBatchCost, []Target{targetBatchCost, targetBatchLive, targetLiveCores}},
}

func scenarioNames() []string {
	names := make([]string, len(scenarios))
	for i, s := range scenarios {
		names[i] = s.name
	}
	return names
}

// parseFlags reads the command line.
func parseFlags(args []string, output io.Writer) (options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(output)
	var o options
	var scenarioList, logLevel, deepEvents string
	fs.BoolVar(&o.quick, "quick", false, "small sizes: the whole run in about 2 minutes on 2 cores (default: about 10 minutes, the machine's load moving it)")
	fs.StringVar(&scenarioList, "scenario", "all", "scenarios to run, comma-separated: all or "+strings.Join(scenarioNames(), ", "))
	fs.StringVar(&o.out, "out", "bench-results", "directory for the JSON results")
	fs.BoolVar(&o.cpuProfile, "cpuprofile", false, "write a CPU profile of each scenario to -pprof-dir")
	fs.StringVar(&o.pprofDir, "pprof-dir", "", "directory for the CPU profiles (default: <out>/pprof); implies -cpuprofile")
	fs.StringVar(&o.postgresURL, "postgres", envOr("NUDGE_TEST_POSTGRES_URL", postgresURLDefault), "PostgreSQL server (a database per step is created on it)")
	fs.StringVar(&o.amqpURL, "amqp", envOr("NUDGE_TEST_AMQP_URL", amqpURLDefault), "RabbitMQ broker")
	fs.DurationVar(&o.pgPoll, "pg-poll", pgchannel.PollIntervalDefault, "poll interval of the PostgreSQL-queue channel")
	fs.BoolVar(&o.noListen, "no-listen", false, "relays and the PostgreSQL queue poll only, without LISTEN/NOTIFY wake-ups (the idle scenario measures both)")
	fs.BoolVar(&o.fleetIdleOnly, "fleet-idle-only", false, "the fleet scenario runs its idle cases only (what idle projections cost), not its live runs")
	fs.DurationVar(&o.relayInterval, "relay-interval", relay.MinIntervalDefault, "the trigger relays' MinInterval: their wait after a publish")
	fs.DurationVar(&o.liveWarmup, "live-warmup", liveWarmupDefault, "how long live runs append before their measured window, every event of it awaited and none measured (0: none; -quick: "+liveWarmupQuick.String()+" unless set)")
	fs.BoolVar(&o.trace, "trace", false, "trace with OpenTelemetry: every span sampled and exported to memory (measures tracing's cost)")
	fs.StringVar(&logLevel, "log-level", "info", "level of the library's own logs, written to <out>/bench-<time>.log (debug, info, warn, error)")
	fs.StringVar(&o.writeDocs, "write-docs", "", "merge the scenarios run into this Markdown `page` (make bench: docs/performance.md), one section each, and keep the JSON results in bench/ beside it")
	fs.StringVar(&deepEvents, "deep-events", "", "the deep scenario's depths, comma-separated event counts (default: 1000000,20000000; -quick: 20000,100000)")
	fs.StringVar(&o.batchCostBaseline, "batchcost-baseline", batchCostBaselineDefault, "the git `revision` whose library the batchcost scenario measures beside this tree's (built with this tree's harness)")
	fs.StringVar(&o.fromJSON, "from-json", "", "run nothing: merge this results `file` into the -write-docs page")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: go run ./internal/bench [flags]\n\nMeasures nudge against real PostgreSQL and RabbitMQ; every figure beside its baseline.\n\n")
		fs.PrintDefaults()
	}
	err := fs.Parse(args)
	if err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q; flags only (see -h)", fs.Args())
	}
	if err := o.logLevel.UnmarshalText([]byte(logLevel)); err != nil {
		return o, fmt.Errorf("-log-level %q: use debug, info, warn or error", logLevel)
	}
	for _, s := range strings.Split(scenarioList, ",") {
		s = strings.TrimSpace(s)
		switch {
		case s == "all":
			o.scenarios = scenarioNames()
		case slices.Contains(scenarioNames(), s):
			if !slices.Contains(o.scenarios, s) {
				o.scenarios = append(o.scenarios, s)
			}
		default:
			return o, fmt.Errorf("-scenario %q: use all or %s", s, strings.Join(scenarioNames(), ", "))
		}
	}
	if o.deepEvents, err = parseDepths(deepEvents); err != nil {
		return o, err
	}
	if o.fromJSON != "" && o.writeDocs == "" {
		return o, errors.New("-from-json needs -write-docs: the page to merge the results into")
	}
	if o.relayInterval <= 0 {
		return o, fmt.Errorf("-relay-interval %s: must be positive", o.relayInterval)
	}
	if o.pgPoll <= 0 {
		return o, fmt.Errorf("-pg-poll %s: must be positive", o.pgPoll)
	}
	fs.Visit(func(f *flag.Flag) { o.liveWarmupSet = o.liveWarmupSet || f.Name == "live-warmup" })
	if o.quick && !o.liveWarmupSet {
		o.liveWarmup = liveWarmupQuick
	}
	if o.liveWarmup < 0 {
		return o, fmt.Errorf("-live-warmup %s: must not be negative", o.liveWarmup)
	}
	if o.pprofDir != "" {
		o.cpuProfile = true
	} else {
		o.pprofDir = filepath.Join(o.out, "pprof")
	}
	return o, nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func main() {
	if spec := os.Getenv(cqrsChildEnv); spec != "" { // a consumer of the cqrs scenario
		os.Exit(runCQRSChild(spec))
	}
	if spec := os.Getenv(batchCostChildEnv); spec != "" { // a measurement of the batchcost scenario
		os.Exit(runBatchCostMeasure(spec))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the benchmarks and returns the exit code: 0 when every scenario ran (whether or not
// it met its targets), 1 when one failed, 2 for bad flags.
func run(args []string, stdout, stderr io.Writer) int {
	opts, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}
	if opts.fromJSON != "" {
		return renderOnly(opts, stdout, stderr)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	started := time.Now()
	// The library's logs go to a file beside the results: the terminal shows the figures.
	if err := os.MkdirAll(opts.out, 0o755); err != nil {
		fmt.Fprintln(stderr, "bench: create the results directory:", err)
		return 1
	}
	logPath := filepath.Join(opts.out, "bench-"+started.UTC().Format(stampLayout)+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	defer func() { _ = logFile.Close() }()
	libLog := slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: opts.logLevel}))
	if opts.trace {
		exported, stopTracing := startTracing(ctx)
		defer func() {
			stopTracing()
			log.Info("tracing", slog.Int64("spans_exported", exported.Load()))
		}()
	}
	h, err := newHarness(ctx, opts, log, libLog)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	defer h.close()
	report := &Report{Format: ReportFormat, StartedAt: started.UTC(), Quick: opts.quick, Args: redact.Args(args), Machine: describeMachine(ctx),
		LogFile: logPath}
	report.Machine.PostgreSQL = h.postgresVersion(ctx)
	if needsAMQP(opts.scenarios) {
		v, err := rabbitVersion(opts.amqpURL)
		if err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
		report.Machine.RabbitMQ = v
	}
	log.InfoContext(ctx, "bench starting", slog.Bool("quick", opts.quick), slog.String("scenarios", strings.Join(opts.scenarios, ",")),
		slog.Int("cpus", report.Machine.CPUs), slog.Any("load_average", report.Machine.LoadAverageStart))

	failed := false
	for _, sc := range scenarios {
		if !slices.Contains(opts.scenarios, sc.name) || ctx.Err() != nil {
			continue
		}
		sec := h.runScenario(ctx, sc)
		report.Scenarios = append(report.Scenarios, sec)
		failed = failed || sec.Error != ""
		if err := sec.Print(stdout); err != nil {
			fmt.Fprintln(stderr, "bench:", err)
		}
	}
	report.DurationSeconds = time.Since(started).Seconds()
	report.Machine.LoadAverageEnd = loadAverage()
	misses, _ := report.Summary(stdout)
	path, err := report.Write(opts.out)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	fmt.Fprintf(stdout, "\n%d target(s) missed; results in %s (%.0f s)\n", misses, path, report.DurationSeconds)
	if opts.writeDocs != "" {
		kept, err := writeDocs(opts.writeDocs, report)
		if err != nil {
			fmt.Fprintln(stderr, "bench: -write-docs:", err)
			return 1
		}
		fmt.Fprintf(stdout, "%s rewritten for %d scenario(s); results kept in %s\n", opts.writeDocs, len(report.Scenarios), kept)
	}
	if failed || ctx.Err() != nil {
		return 1
	}
	return 0
}

// renderOnly merges the results file -from-json names into the -write-docs page.
func renderOnly(opts options, stdout, stderr io.Writer) int {
	report, err := readReport(opts.fromJSON)
	if err == nil {
		var kept string
		if kept, err = writeDocs(opts.writeDocs, report); err == nil {
			fmt.Fprintf(stdout, "%s rewritten for %d scenario(s); results kept in %s\n", opts.writeDocs, len(report.Scenarios), kept)
			return 0
		}
	}
	fmt.Fprintln(stderr, "bench:", err)
	return 1
}

// runScenario runs sc with its CPU profile and timing, and returns its section.
func (h *harness) runScenario(ctx context.Context, sc scenario) *Section {
	sec := &Section{Name: sc.name, Title: sc.title, Params: map[string]any{}, StartedAt: time.Now().UTC(), Metrics: []Metric{}, Checks: []Check{}}
	h.log.InfoContext(ctx, "scenario starting", slog.String("scenario", sc.name))
	if h.opts.cpuProfile {
		stopProfile, path, err := startCPUProfile(h.opts.pprofDir, sc.name, sec.StartedAt)
		if err != nil {
			sec.Note("no CPU profile: %v", err)
		} else {
			sec.CPUProfile = path
			defer stopProfile()
		}
	}
	cpu := ProcessCPU()
	err := sc.run(ctx, h, sec)
	sec.DurationSeconds = time.Since(sec.StartedAt).Seconds()
	sec.GoCPUSeconds = (ProcessCPU() - cpu).Seconds()
	if err != nil {
		sec.Error = err.Error()
		h.log.ErrorContext(ctx, "scenario failed", slog.String("scenario", sc.name), slog.Any("error", err))
		for _, t := range sc.targets {
			if !slices.ContainsFunc(sec.Checks, func(c Check) bool { return c.Target == t.Name }) {
				sec.Checks = append(sec.Checks, t.Missed("the scenario failed before measuring it"))
			}
		}
	}
	return sec
}

// startCPUProfile starts a CPU profile written to dir; stop ends it.
func startCPUProfile(dir, name string, at time.Time) (stop func(), path string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	path = filepath.Join(dir, fmt.Sprintf("cpu-%s-%s.pprof", name, at.UTC().Format(stampLayout)))
	f, err := os.Create(path)
	if err != nil {
		return nil, "", err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, "", err
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }, path, nil
}

// postgresOnly are the scenarios that do not use RabbitMQ.
var postgresOnly = []string{"rebuild", "status", "horizon", "partitions", "scaleout", "console", "deep"}

// needsAMQP reports whether any of the scenarios uses RabbitMQ.
func needsAMQP(names []string) bool {
	return slices.ContainsFunc(names, func(s string) bool { return !slices.Contains(postgresOnly, s) })
}

// postgresVersion returns the server's version, empty if unknown.
func (h *harness) postgresVersion(ctx context.Context) string {
	var v string
	_ = h.admin.QueryRow(ctx, `SHOW server_version`).Scan(&v)
	return v
}

// rabbitVersion connects to the broker and returns its version.
func rabbitVersion(rawURL string) (string, error) {
	conn, err := dialAMQP(rawURL, "nudge_bench.check")
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	v, _ := conn.Properties["version"].(string)
	return v, nil
}

// sizes are a run's sizes; sizesFor picks them.
type sizes struct {
	rebuildEvents  int
	rebuildStreams int
	naiveEvents    int
	batchSizes     []int

	liveRate     int
	liveWriters  int
	liveStreams  int
	liveDuration time.Duration
	hopDuration  time.Duration
	hopRate      int

	appendRun    time.Duration
	appendRounds int

	idleWindow time.Duration

	fanoutEvents       int
	fanoutProjections  []int
	slowLiveDuration   time.Duration
	slowLiveProjection int

	recoveryEvents int

	statusEvents int
	statusRuns   int           // the most runs of each status measurement
	statusBudget time.Duration // after statusMinRuns, no new run starts past it

	horizonEvents      int
	horizonConnections int // extra connections, of which horizonWriters write
	horizonWriters     int
	horizonRounds      int // rounds of a read of the whole store per condition
	horizonCalls       int // horizon statements of each kind timed per condition, over the rounds

	partitionEvents int
	partitionRounds int // measured reads of the whole log, each way

	blueGreenEvents int // the history a new version builds beside the live one

	scaleOutEvents int // the backlog the scale-out cases catch up
	// scaleOutFlatEvents is the part of the backlog over which the unpartitioned projection's
	// rate with a wait per event is measured (its fixed wait makes the rate steady); 0: all.
	scaleOutFlatEvents int
	scaleOutWorkers    []int // the worker counts of the partitioned cases
	scaleOutRounds     int   // rounds of the partitioning cost's catch-ups, each way

	fleetProjections []int // the projection counts of the fleet's live runs; the last one idles
	fleetRate        int   // appends per second
	fleetDuration    time.Duration
	fleetIdleWindow  time.Duration

	deepEvents      []int         // the deep scenario's depths, in order; the first is every figure's baseline
	deepCatchUp     int           // events of the catch-ups from zero and near the end (at most a quarter of a depth)
	deepAppends     int           // single-event appends timed at each depth
	deepWarmAppends int           // single-event appends before them, untimed
	deepLive        time.Duration // the window of the live projection at the head

	batchCostBatches int           // catch-ups of each kind whose per-batch CPU is measured
	batchCostLive    time.Duration // the live run's measured window
	batchCostRounds  int           // rounds, each measuring this tree and the baseline
}

// sizesFor returns the default sizes (about 10 minutes on 2 cores, 4 of them the blue/green
// build of a million events paced by the live lag; the machine's load moves it) or the quick
// ones (about 2).
func sizesFor(quick bool) sizes {
	s := sizes{
		rebuildEvents: 1_000_000, rebuildStreams: 10_000, naiveEvents: 10_000, batchSizes: []int{1000},
		liveRate: 1000, liveWriters: 8, liveStreams: 100, liveDuration: 5 * time.Second,
		hopDuration: time.Second, hopRate: 200,
		appendRun: time.Second, appendRounds: 2,
		idleWindow:   20 * time.Second,
		fanoutEvents: 20_000, fanoutProjections: []int{1, 10, 50}, slowLiveDuration: 5 * time.Second, slowLiveProjection: 10,
		recoveryEvents: 50_000,
		statusEvents:   1_000_000, statusRuns: 7, statusBudget: 8 * time.Second,
		horizonEvents: 200_000, horizonConnections: 200, horizonWriters: 50, horizonRounds: 3, horizonCalls: 2000,
		partitionEvents: 200_000, partitionRounds: 3,
		blueGreenEvents: 1_000_000,
		scaleOutEvents:  30_000, scaleOutFlatEvents: 3_000, scaleOutWorkers: []int{1, 4, 8}, scaleOutRounds: 3,
		fleetProjections: []int{1, fleetBase, 100, 300}, fleetRate: 150, fleetDuration: 10 * time.Second, fleetIdleWindow: 30 * time.Second,
		deepEvents: []int{1_000_000, 20_000_000}, deepCatchUp: 200_000, deepAppends: 2000, deepWarmAppends: 200, deepLive: 10 * time.Second,
		batchCostBatches: 2000, batchCostLive: 8 * time.Second, batchCostRounds: 3,
	}
	if quick {
		s.rebuildEvents, s.naiveEvents, s.batchSizes = 50_000, 2_000, []int{500, 1000}
		s.liveDuration, s.hopDuration = time.Second, 500*time.Millisecond
		s.appendRun, s.appendRounds = 500*time.Millisecond, 1
		s.idleWindow = 2 * time.Second
		s.fanoutEvents, s.slowLiveDuration = 5_000, time.Second
		s.recoveryEvents = 10_000
		s.statusEvents, s.statusBudget = 50_000, 3*time.Second
		s.horizonEvents, s.horizonRounds = 25_000, 1
		s.partitionEvents, s.partitionRounds = 20_000, 1
		s.blueGreenEvents = s.rebuildEvents // one loaded history for both
		s.scaleOutEvents, s.scaleOutFlatEvents, s.scaleOutWorkers = 6_000, 1_200, []int{1, 4}
		s.fleetRate, s.fleetDuration, s.fleetIdleWindow = 100, 3*time.Second, 10*time.Second
		s.deepEvents, s.deepCatchUp, s.deepAppends, s.deepWarmAppends, s.deepLive = []int{20_000, 100_000}, 20_000, 300, 30, 2*time.Second
		s.batchCostBatches, s.batchCostLive, s.batchCostRounds = 500, 3*time.Second, 1
	}
	return s
}
