// Command chaos is nudge's fault-injection suite (`make chaos`): it injects the faults real
// deployments see — killed workers and relays, crashed and restarted databases, restarted
// brokers and cut connections, lost triggers, a long transaction, a poison event, malformed
// input, hostile names — while writers append and worker processes project, then verifies
// every read model against the event store: every appended event present with the store's
// content and in stream order, none twice in the exactly-once model.
//
// Each scenario gets a database of its own on a private PostgreSQL cluster that the suite
// creates (initdb, as the postgres OS user when run as root; fsync on, scram-sha-256
// passwords) and removes at the end, so crashing it disturbs nobody, and RabbitMQ names and
// connection names under a prefix of its own on the shared broker, whose connections it
// closes; broker-restart runs on a private RabbitMQ node the suite starts, restarts and
// removes. Worker and relay processes are the chaosworker and chaosrelay binaries, built once
// into a temporary directory.
//
// Usage:
//
//	go run ./internal/chaos [-scenario all|NAME[,NAME…]] [-budget 8m] [-timeout-scale 1] [-seed N] [-rate 300] [-v]
//
// -timeout-scale (default: CHAOS_TIMEOUT_SCALE, else 1) multiplies the harness's deadlines and
// the default budget, for a busy machine (make chaos-loaded runs with 3); the bounds the
// checks assert about the product stay as they are.
//
// Each scenario prints one line (faults, events appended and projected per read model,
// missing, duplicated in the exactly-once model, max lag, time to recover, PASS or FAIL); the
// results go to chaos-results/results.json and the logs of every process to
// chaos-results/logs/. Exit code 0 when every scenario passed, 1 otherwise, 2 for a wrong
// command line.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nudgeworks/nudge/internal/pgcluster"
	"github.com/nudgeworks/nudge/internal/rabbitcluster"
)

// budgetDefault is the default bound on a whole run, before -timeout-scale.
const budgetDefault = 8 * time.Minute

// cleanupReserve is kept from the budget for stopping workers and removing the cluster.
const cleanupReserve = 15 * time.Second

func main() {
	os.Exit(run())
}

func run() int {
	scaleDefault, err := timeoutScaleDefault()
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		return 2
	}
	var (
		which   = flag.String("scenario", "all", "`name`s of the scenarios to run, comma-separated, or all")
		budget  = flag.Duration("budget", 0, "bound on the whole run; scenarios still running when it ends fail (default 8m × -timeout-scale)")
		scale   = flag.Float64("timeout-scale", scaleDefault, "multiplies the harness's deadlines and the default budget, for a busy machine (default "+timeoutScaleEnv+", else 1)")
		seed    = flag.Uint64("seed", 0, "seed of the random choices (kill moments, dropped triggers, garbage); 0 picks one")
		rate    = flag.Int("rate", 300, "events appended per second by the writers, in all (scale appends its own 2,000)")
		results = flag.String("results", "chaos-results", "`directory` for results.json and the logs")
		verbose = flag.Bool("v", false, "print progress to stderr")
		list    = flag.Bool("list", false, "list the scenarios and exit")
	)
	flag.IntVar(&fleetWorkers, "fleet-workers", fleetWorkers, "worker processes scale-fleet scales up to (at least 8)")
	flag.IntVar(&fleetSplit, "fleet-split", fleetSplit, "how many of scale-fleet's 50 projections are split into 64 partitions (1 to 50)")
	flag.Parse()
	fleetWorkers = max(fleetWorkers, 8)
	fleetSplit = min(max(fleetSplit, 1), fleetProjections)
	all := scenarios()
	if *list {
		for _, sc := range all {
			fmt.Printf("%-17s injects: %s\n%-17s checks:  %s\n", sc.name, sc.injects, "", sc.checks)
		}
		return 0
	}
	if !(*scale >= 1 && *scale <= timeoutScaleMax) {
		fmt.Fprintf(os.Stderr, "chaos: -timeout-scale must be from 1 to %d, got %g\n", timeoutScaleMax, *scale)
		return 2
	}
	timeoutScale = *scale
	if *budget == 0 {
		*budget = deadline(budgetDefault)
	}
	if *budget < time.Minute || *rate < 1 {
		fmt.Fprintf(os.Stderr, "chaos: -budget must be at least 1m and -rate at least 1\n")
		return 2
	}
	selected, err := selectScenarios(all, *which)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		return 2
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	started := time.Now()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	logDir := filepath.Join(*results, "logs")
	if err := os.RemoveAll(logDir); err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		return 1
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		return 1
	}
	logFile, err := os.Create(filepath.Join(logDir, "runner.log"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		return 1
	}
	defer func() { _ = logFile.Close() }()
	s := &suite{
		broker:     newBroker(),
		logDir:     logDir,
		runID:      fmt.Sprintf("%d", started.Unix()),
		pgPassword: "chaos-pg-" + randomHex(8),
		seed:       *seed,
		rate:       *rate,
		verbose:    *verbose,
		log:        slog.New(slog.NewJSONHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	fmt.Printf("chaos: %d scenario(s), seed %d, budget %s, deadlines ×%g, %d events/s from 4 writers, 2 worker processes; logs in %s\n",
		len(selected), *seed, *budget, timeoutScale, *rate, logDir)

	report := &runReport{Started: started, Seed: *seed, Budget: *budget, TimeoutScale: timeoutScale, Rate: *rate}
	runCtx, cancel := context.WithTimeout(ctx, *budget-cleanupReserve)
	defer cancel()
	if err := s.prepare(runCtx, selected); err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		return 1
	}
	defer func() {
		s.cluster.Remove(context.Background())
		if s.rabbit != nil {
			s.rabbit.Remove()
		}
		_ = os.RemoveAll(filepath.Dir(s.workerBin))
	}()
	rabbit := ""
	if s.rabbit != nil {
		rabbit = fmt.Sprintf(" and a private RabbitMQ node %s on 127.0.0.1:%d", s.rabbit.Name(), s.rabbit.Port())
	}
	fmt.Printf("chaos: built the worker and the CLI, started a private PostgreSQL on 127.0.0.1:%d%s (%s)\n",
		s.cluster.Port(), rabbit, time.Since(started).Round(100*time.Millisecond))

	for _, sc := range selected {
		var r *result
		if runCtx.Err() != nil {
			r = &result{Scenario: sc.name, Recover: -1, Error: "not run: " + errBudget.Error()}
			if ctx.Err() != nil {
				r.Error = "not run: interrupted"
			}
			r.finish()
		} else {
			s.progress(sc.name, "starting")
			r = s.runScenario(runCtx, sc)
		}
		for _, g := range r.Greps {
			fmt.Printf("  grep %s in %d files: %d hits\n", g.Pattern, g.Files, g.Hits)
		}
		fmt.Println(r.line())
		if s.verbose {
			for _, c := range r.Checks {
				fmt.Fprintf(os.Stderr, "  %-17s check %-4s %s: %s\n", sc.name, okText(c.OK), c.Name, c.Detail)
			}
			for _, n := range r.Notes {
				fmt.Fprintf(os.Stderr, "  %-17s note %s\n", sc.name, n)
			}
		}
		report.Scenarios = append(report.Scenarios, r)
	}
	report.Took = time.Since(started)
	report.Passed = true
	for _, r := range report.Scenarios {
		report.Passed = report.Passed && r.Passed
	}
	path, err := report.write(*results)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: write the results: %v\n", err)
		return 1
	}
	if leak := findSecrets(path, s.pgPassword); leak != "" {
		fmt.Printf("chaos: FAIL: %s holds a password: %s\n", path, leak)
		report.Passed = false
		if _, err := report.write(*results); err != nil {
			fmt.Fprintf(os.Stderr, "chaos: write the results: %v\n", err)
		}
	}
	verdict := "PASS"
	if !report.Passed {
		verdict = "FAIL"
	}
	fmt.Printf("chaos: %s in %s; results in %s\n", verdict, report.Took.Round(time.Second), path)
	if !report.Passed {
		return 1
	}
	return 0
}

func okText(ok bool) string {
	if ok {
		return "ok"
	}
	return "FAIL"
}

// selectScenarios returns the scenarios named in which ("all" or a comma-separated list).
func selectScenarios(all []scenario, which string) ([]scenario, error) {
	if which == "all" {
		return slices.DeleteFunc(slices.Clone(all), func(sc scenario) bool { return sc.optIn }), nil
	}
	var out []scenario
	for _, name := range strings.Split(which, ",") {
		i := slices.IndexFunc(all, func(sc scenario) bool { return sc.name == strings.TrimSpace(name) })
		if i < 0 {
			var names []string
			for _, sc := range all {
				names = append(names, sc.name)
			}
			return nil, fmt.Errorf("unknown scenario %q; use all or one of %s", name, strings.Join(names, ", "))
		}
		out = append(out, all[i])
	}
	return out, nil
}

// prepare checks the broker, builds the binaries and starts the private cluster.
func (s *suite) prepare(ctx context.Context, selected []scenario) error {
	if err := s.broker.ping(); err != nil {
		return err
	}
	for _, sc := range selected {
		if sc.name == "connection-cut" || sc.name == "security" {
			if _, err := rabbitmqctl(ctx, "status"); err != nil {
				return fmt.Errorf("scenario %s needs rabbitmqctl (or NUDGE_TEST_RABBITMQCTL): %w", sc.name, err)
			}
			break
		}
	}
	binDir, err := os.MkdirTemp("", "nudge-chaos-bin-")
	if err != nil {
		return err
	}
	s.workerBin, s.relayBin, s.cliBin = filepath.Join(binDir, "chaosworker"), filepath.Join(binDir, "chaosrelay"), filepath.Join(binDir, "nudge")
	var wg sync.WaitGroup
	errs := make([]error, 5)
	wg.Go(func() { errs[4] = goBuild(ctx, s.relayBin, "./internal/chaos/chaosrelay") })
	if slices.ContainsFunc(selected, func(sc scenario) bool { return sc.settings.privateBroker }) {
		wg.Go(func() {
			s.rabbit, errs[3] = rabbitcluster.Start(ctx, rabbitcluster.Options{Name: "nudge-chaos-" + s.runID, Logger: s.log,
				HandshakeTimeout: brokerHandshakeTimeout})
		})
	}
	wg.Go(func() { errs[0] = goBuild(ctx, s.workerBin, "./internal/chaos/chaosworker") })
	wg.Go(func() { errs[1] = goBuild(ctx, s.cliBin, "./cmd/nudge") })
	wg.Go(func() {
		var c *pgcluster.Cluster
		// Durable and with scram passwords, as production runs: crashes are recovered from
		// the WAL, and every process authenticates.
		c, errs[2] = pgcluster.NewWith(ctx, s.log, pgcluster.Options{Durable: true, Password: s.pgPassword,
			ProgramTimeout: deadline(pgcluster.ProgramTimeoutDefault), MaxConnections: maxConnections(selected)})
		s.cluster = c
	})
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		if s.cluster != nil {
			s.cluster.Remove(context.WithoutCancel(ctx))
		}
		if s.rabbit != nil {
			s.rabbit.Remove()
		}
		_ = os.RemoveAll(binDir)
		return err
	}
	return nil
}

// maxConnections is the private cluster's max_connections for the selected scenarios: the
// default, or what scale-fleet's workers take at most (each holds up to workerConnections)
// with room for the suite's own pools.
func maxConnections(selected []scenario) int {
	n := pgcluster.MaxConnectionsDefault
	if slices.ContainsFunc(selected, func(sc scenario) bool { return sc.name == "scale-fleet" }) {
		n = max(n, fleetWorkers*workerConnections+100)
	}
	return n
}

// goBuild builds the package pkg of this module into out.
func goBuild(ctx context.Context, out, pkg string) error {
	root, err := moduleRoot(ctx)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// moduleRoot is the directory of this module's go.mod.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run the suite from inside the nudge module (go run ./internal/chaos)")
	}
	return filepath.Dir(mod), nil
}

// findSecrets describes the first password or URL with a clear password in the file at path,
// "" if there is none.
func findSecrets(path, password string) string {
	found := ""
	err := grepFile(path, func(n int, line string) {
		if found != "" {
			return
		}
		if strings.Contains(line, password) {
			found = fmt.Sprintf("line %d: the PostgreSQL password", n)
			return
		}
		for _, m := range clearPasswordURL.FindAllStringSubmatch(line, -1) {
			if m[1] != "xxxxx" {
				found = fmt.Sprintf("line %d: a URL with a password", n)
				return
			}
		}
	})
	if err != nil {
		return err.Error()
	}
	return found
}
