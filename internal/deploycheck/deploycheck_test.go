package deploycheck_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/nudgeworks/nudge/deadletter"
	"github.com/nudgeworks/nudge/internal/deploycheck"
	"github.com/nudgeworks/nudge/internal/testwait"
	"github.com/nudgeworks/nudge/metrics"
	"github.com/nudgeworks/nudge/projection"
	"github.com/nudgeworks/nudge/trigger"
	"github.com/nudgeworks/nudge/worker"
)

const (
	rulesDir   = "../../deploy/prometheus"
	rulesFile  = "nudge-alerts.yml"
	rulesTest  = "nudge-alerts.test.yml"
	dashboard  = "../../deploy/grafana/nudge-dashboard.json"
	runbookURL = "https://github.com/nudgeworks/nudge/blob/main/docs/operations/runbook.md#"
)

// alertNames are the alerts nudge ships; the runbook has a heading for each.
var alertNames = []string{
	"NudgeProjectionFailing", "NudgeProjectionLagging", "NudgeStreamsParked", "NudgeDeadLettersGrowing",
	"NudgeHorizonHeld", "NudgePartitionUnowned", "NudgeProjectionStalled", "NudgeBuildNotGaining", "NudgeStalenessSLO",
}

// promtool returns promtool's path; it skips t where promtool is missing, or fails it with
// CI=true (scripts/tools.sh installs it: Debian's prometheus package).
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is not installed (scripts/tools.sh, or apt-get install prometheus)")
		}
		t.Skip("promtool is not installed (scripts/tools.sh, or apt-get install prometheus)")
	}
	return path
}

// TestAlertRulesPassPromtool: promtool finds the rules valid and their unit tests pass.
func TestAlertRulesPassPromtool(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTest}} {
		ctx, cancel := context.WithTimeout(context.Background(), testwait.For(2*time.Minute))
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = rulesDir
		out, err := cmd.CombinedOutput()
		cancel()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

type ruleFile struct {
	Groups []struct {
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestAlertRulesNameExportedMetrics: the file has exactly the alerts nudge documents, each
// with its runbook link, and every expression names only metrics nudge exports.
func TestAlertRulesNameExportedMetrics(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(rulesDir, rulesFile))
	require.NoError(t, err)
	var f ruleFile
	require.NoError(t, yaml.Unmarshal(raw, &f))
	exported := exportedMetrics(t)
	var names []string
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
			require.Equal(t, runbookURL+strings.ToLower(r.Alert), r.Annotations["runbook_url"], r.Alert)
			requireExported(t, r.Alert, r.Expr, exported)
		}
	}
	require.ElementsMatch(t, alertNames, names)
}

// TestDashboardNamesExportedMetrics: every query of the dashboard (panels and variables)
// names at least one metric, and only metrics nudge exports.
func TestDashboardNamesExportedMetrics(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(dashboard)
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(raw, &d))
	exported := exportedMetrics(t)
	queries := 0
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			requireExported(t, p.Title, tg.Expr, exported)
			queries++
		}
	}
	for _, v := range d.Templating.List {
		if v.Definition != "" {
			requireExported(t, "variable "+v.Name, v.Definition, exported)
		}
	}
	require.Greater(t, queries, 20, "the dashboard's panels have queries")
}

func requireExported(t *testing.T, where, expr string, exported map[string]bool) {
	t.Helper()
	names := deploycheck.MetricNames(expr)
	require.NotEmpty(t, names, "%s: %q names no nudge metric", where, expr)
	for _, n := range names {
		require.True(t, exported[n], "%s: %s is not a metric nudge exports (expression %q)", where, n, expr)
	}
}

// exportedMetrics gathers a registry holding every collector of package metrics, each with a
// sample, and returns the series names it exposes (a histogram's _bucket, _sum and _count).
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg, CacheTTL: -1})
	require.NoError(t, err)
	m.ObserveBatch(projection.BatchReport{Projection: "p", Events: 1, Staleness: []time.Duration{time.Millisecond}})
	m.ObserveBatch(projection.BatchReport{Projection: "p", Err: &projection.HandlerError{Err: projection.ErrHandler}})
	m.ObserveCatchUp("p", projection.Result{Paced: time.Second}, nil)
	m.ObserveTrigger(worker.TriggerReport{Projection: "p", Trigger: trigger.Trigger{At: time.Now()}, Received: time.Now()})
	m.ObserveRelay(projection.BatchReport{Projection: "nudge-relay", Events: 1, Staleness: []time.Duration{time.Millisecond}})
	require.NoError(t, m.WatchRunner(statusReader{}))
	require.NoError(t, m.WatchWorker(stats{}, "p"))
	require.NoError(t, m.WatchDeadLetters(deadLetters{}, "p"))
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	require.NoError(t, m.AddRouterMetrics(router))

	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]bool{}
	for _, f := range families {
		out[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[f.GetName()+s] = true
			}
		}
	}
	for _, want := range []string{"nudge_projection_event_staleness_seconds", "nudge_relay_delay_seconds", "nudge_projection_lag_seconds",
		"nudge_worker_partitions_owned", "nudge_dead_letters_failed", "nudge_projection_partitions"} {
		require.True(t, out[want], "the registry exposes %s", want)
	}
	return out
}

type statusReader struct{}

func (statusReader) Names() []string { return []string{"p"} }

func (statusReader) Status(context.Context, string) (projection.Status, error) {
	return projection.Status{State: projection.StateRunning, VersionState: projection.VersionActive}, nil
}

type stats struct{}

func (stats) Stats(string) worker.Stats { return worker.Stats{} }

type deadLetters struct{}

func (deadLetters) List(context.Context, deadletter.Filter) ([]deadletter.Record, error) {
	return nil, nil
}

// TestMetricNames: names are found wherever PromQL puts them, once each.
func TestMetricNames(t *testing.T) {
	t.Parallel()
	got := deploycheck.MetricNames(`histogram_quantile(0.99, sum by (le) (rate(nudge_a_bucket{projection=~"$p"}[5m]))) / nudge_b and nudge_a_bucket`)
	require.True(t, slices.Equal([]string{"nudge_a_bucket", "nudge_b"}, got), got)
}

// TestRunbookHasEveryAlert: each alert's runbook_url lands on a heading of its own in
// docs/operations/runbook.md ("### <Alert>", whose GitHub anchor is the lowercased name), so
// the link an operator follows from a firing alert says what it means and what to do.
func TestRunbookHasEveryAlert(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../docs/operations/runbook.md")
	require.NoError(t, err)
	headings := map[string]bool{}
	for line := range strings.Lines(string(raw)) {
		if rest, ok := strings.CutPrefix(line, "### "); ok {
			headings[strings.ToLower(strings.TrimSpace(rest))] = true
		}
	}
	for _, name := range alertNames {
		require.True(t, headings[strings.ToLower(name)], "docs/operations/runbook.md has no heading ### %s for the alert's runbook_url", name)
	}
}
