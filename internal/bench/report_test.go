package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/redact"
	"github.com/nudgeworks/nudge/relay"
)

func TestPercentileIsNearestRank(t *testing.T) {
	t.Parallel()
	var samples []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose: Summarize sorts
		samples = append(samples, time.Duration(i)*time.Millisecond)
	}
	l := Summarize(samples)
	require.Equal(t, 100, l.Count)
	require.Equal(t, 50*time.Millisecond, l.P50)
	require.Equal(t, 90*time.Millisecond, l.P90)
	require.Equal(t, 99*time.Millisecond, l.P99)
	require.Equal(t, 100*time.Millisecond, l.Max)
	require.Equal(t, 50500*time.Microsecond, l.Mean)

	// With fewer than 100 samples, p99 is the largest.
	require.Equal(t, 7*time.Millisecond, Percentile([]time.Duration{1 * time.Millisecond, 2 * time.Millisecond, 7 * time.Millisecond}, 0.99))
	require.Equal(t, 2*time.Millisecond, Percentile([]time.Duration{1 * time.Millisecond, 2 * time.Millisecond, 7 * time.Millisecond}, 0.5))
	require.Equal(t, 3*time.Second, Percentile([]time.Duration{3 * time.Second}, 0.01))
	require.Zero(t, Percentile(nil, 0.99))
	require.Equal(t, Latency{}, Summarize(nil))

	extra := l.Extra()
	require.InDelta(t, 99.0, extra["p99_ms"], 1e-9)
	require.InDelta(t, 100.0, extra["samples"], 1e-9)
}

func TestTargetCheck(t *testing.T) {
	t.Parallel()
	throughput := Target{Name: "rebuild", Op: AtLeast, Threshold: 50_000, Unit: "events/s"}
	c := throughput.Check("best at batch=1000", 61_000)
	require.True(t, c.Pass)
	require.InDelta(t, 0.22, c.Margin, 1e-9)
	require.Equal(t, "PASS  rebuild >= 50,000 events/s: 61,000 events/s (best at batch=1000), 22% to spare", c.String())

	c = throughput.Check("batch=100", 45_000)
	require.False(t, c.Pass)
	require.InDelta(t, -0.10, c.Margin, 1e-9)
	require.Equal(t, "MISS  rebuild >= 50,000 events/s: 45,000 events/s (batch=100), 10% short", c.String())

	require.True(t, throughput.Check("", 50_000).Pass, "the threshold itself passes")

	latency := Target{Name: "live p99", Op: AtMost, Threshold: 50, Unit: "ms"}
	c = latency.Check("amqp", 12.5)
	require.True(t, c.Pass)
	require.InDelta(t, 0.75, c.Margin, 1e-9)
	require.Equal(t, "PASS  live p99 <= 50.0 ms: 12.5 ms (amqp), 75% to spare", c.String())
	c = latency.Check("amqp", 75)
	require.False(t, c.Pass)
	require.Contains(t, c.String(), "MISS  live p99 <= 50.0 ms: 75.0 ms (amqp), 50% short")

	ratio := Target{Name: "vs naive", Op: AtLeast, Threshold: 30, Unit: "×"}
	require.Equal(t, "MISS  vs naive >= 30.0×: 7.3× (x), 76% short", ratio.Check("x", 7.3).String())
	cost := Target{Name: "cost", Op: AtMost, Threshold: 10, Unit: "%"}.about("RabbitMQ")
	require.Equal(t, "PASS  cost, RabbitMQ <= 10.0%: 4.0% (y), 6.0 points to spare", cost.Check("y", 4).String())
	require.Equal(t, "MISS  cost, RabbitMQ <= 10.0%: 34.7% (y), 24.7 points over", cost.Check("y", 34.7).String())

	missed := latency.Missed("the scenario failed")
	require.False(t, missed.Pass)
	require.True(t, missed.Missing)
	require.Equal(t, "MISS  live p99 <= 50.0 ms: not measured (the scenario failed)", missed.String())
}

func TestFormatting(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -1234: "-1,234", -100: "-100"} {
		require.Equal(t, want, Thousands(n), n)
	}
	require.Equal(t, "12,346", FormatValue(12345.6, ""))
	require.Equal(t, "3.25", FormatValue(3.25, "ms"))
	require.Equal(t, "12.3", FormatValue(12.3456, "ms"))
	require.Equal(t, "0.014×", FormatValue(0.01402, "×"))
	require.Equal(t, "3.2×", FormatValue(3.2, "×"))
	require.Equal(t, "99.5", FormatValue(99.49, "MB"))
	require.Equal(t, "30.0×", FormatValue(30, "×"))
	require.Equal(t, "—", FormatValue(Ratio(1, 0)/0, "×"))
	require.Zero(t, Ratio(5, 0), "no baseline, no ratio")
	require.InDelta(t, 2.5, Ratio(5, 2), 1e-9)

	m := Metric{Case: "a", Name: "events_per_s", Unit: "events/s", Value: 300}.WithBaseline("naive", 10)
	require.Equal(t, "naive", m.Baseline)
	require.InDelta(t, 30, m.Ratio, 1e-9)
}

func TestTableAlignsColumns(t *testing.T) {
	t.Parallel()
	tab := &Table{Header: []string{"case", "events/s"}}
	tab.Add("naive", "1,781")
	tab.Add("per-event batch=100", "38,604")
	var b bytes.Buffer
	require.NoError(t, tab.Write(&b))
	require.Equal(t, ""+
		"case                 events/s\n"+
		"-----------------------------\n"+
		"naive                   1,781\n"+
		"per-event batch=100    38,604\n", b.String())
}

func TestParseStatus(t *testing.T) {
	t.Parallel()
	status := "Name:\tbench\nVmPeak:\t 1234 kB\nVmHWM:\t   40960 kB\nVmRSS:\t   20480 kB\nThreads:\t8\n"
	m, err := ParseStatus([]byte(status))
	require.NoError(t, err)
	require.InDelta(t, 40.0, m.PeakMB, 1e-9)
	require.InDelta(t, 20.0, m.RSSMB, 1e-9)

	_, err = ParseStatus([]byte("Name:\tbench\n"))
	require.ErrorIs(t, err, errNoProc)
	_, err = ParseStatus([]byte("VmHWM:\tlots kB\nVmRSS:\t1 kB\n"))
	require.ErrorContains(t, err, "VmHWM")

	if _, err := os.Stat("/proc/self/status"); err == nil {
		m, err := ReadMemory()
		require.NoError(t, err)
		require.Positive(t, m.RSSMB)
		require.GreaterOrEqual(t, m.PeakMB, m.RSSMB)
	}
}

func TestExpectedVersionsMatchesTheLoadLayout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ n, streams int }{{0, 10}, {5, 10}, {10, 10}, {25, 10}, {1000, 300}, {2000, 300}} {
		// eventload: event i is version i/streams+1 of stream i%streams.
		latest := map[int]int64{}
		for i := range tc.n {
			latest[i%tc.streams] = int64(i/tc.streams + 1)
		}
		var sum int64
		for _, v := range latest {
			sum += v
		}
		rows, got := expectedVersions(tc.n, tc.streams)
		require.Equal(t, int64(len(latest)), rows, "%+v", tc)
		require.Equal(t, sum, got, "%+v", tc)
	}
}

func TestTicketColumnsKeepOneRowPerTicketAtItsLatestVersion(t *testing.T) {
	t.Parallel()
	c := newTicketColumns(4)
	c.add(ticketRegistered{TicketID: "a", Customer: "old", Price: 1}, 1)
	c.add(ticketRegistered{TicketID: "b", Customer: "b", Price: 2}, 1)
	c.add(ticketRegistered{TicketID: "a", Customer: "new", Price: 3}, 2)
	c.add(ticketRegistered{TicketID: "a", Customer: "older", Price: 4}, 1) // out of order: ignored
	require.Equal(t, []string{"a", "b"}, c.ids)
	require.Equal(t, []string{"new", "b"}, c.customers)
	require.Equal(t, []float64{3, 2}, c.prices)
	require.Equal(t, []int64{2, 1}, c.versions)
}

func TestTicketPayloadIsAbout200Bytes(t *testing.T) {
	t.Parallel()
	for _, i := range []int{0, 7, 999_999} {
		p := ticketPayload(eventloadStream(i%10_000), i)
		require.InDelta(t, 200, len(p), 20, p)
		var v ticketRegistered
		require.NoError(t, json.Unmarshal([]byte(p), &v))
		require.Equal(t, eventloadStream(i%10_000), v.TicketID)
	}
}

func TestReportJSONShape(t *testing.T) {
	t.Parallel()
	started := time.Date(2026, 11, 22, 4, 41, 58, 0, time.UTC)
	sec := &Section{Name: "rebuild", Title: "rebuild", Params: map[string]any{"events": 100}, StartedAt: started, DurationSeconds: 12.4}
	sec.AddMetric(Metric{Case: "naive", Name: "events_per_s", Unit: "events/s", Value: 1000})
	sec.AddMetric(Metric{Case: "per-event batch=500", Name: "events_per_s", Unit: "events/s", Value: 40_000,
		Extra: map[string]float64{"peak_rss_mb": 20}}.WithBaseline("naive", 1000))
	sec.AddCheck(Target{Name: "rebuild", Op: AtLeast, Threshold: 50_000, Unit: "events/s"}, "batch=500", 40_000)
	r := &Report{Format: ReportFormat, StartedAt: started, Quick: true, Args: []string{"-quick"},
		Machine: Machine{GoVersion: "go1.25", CPUs: 2, Commit: "abc"}, Scenarios: []*Section{sec}}

	dir := filepath.Join(t.TempDir(), "results")
	path, err := r.Write(dir)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "bench-20261122T044158Z.json"), path)
	data, err := os.ReadFile(path)
	require.NoError(t, err)

	var got map[string]any
	require.NoError(t, json.Unmarshal(data, &got))
	require.InDelta(t, ReportFormat, got["format"], 0)
	require.Equal(t, "2026-11-22T04:41:58Z", got["started_at"])
	require.Equal(t, true, got["quick"])
	machine := got["machine"].(map[string]any)
	require.Equal(t, "go1.25", machine["go_version"])
	require.InDelta(t, 2, machine["cpus"], 0)
	require.Equal(t, "abc", machine["commit"])
	require.NotContains(t, string(data), "hostname", "no host names in published results")

	scenario := got["scenarios"].([]any)[0].(map[string]any)
	require.Equal(t, "rebuild", scenario["name"])
	require.InDelta(t, 100, scenario["params"].(map[string]any)["events"], 0)
	metrics := scenario["metrics"].([]any)
	require.Len(t, metrics, 2)
	baseline := metrics[0].(map[string]any)
	require.NotContains(t, baseline, "baseline", "a baseline has no baseline of its own")
	measured := metrics[1].(map[string]any)
	require.Equal(t, "naive", measured["baseline"])
	require.InDelta(t, 1000, measured["baseline_value"], 0)
	require.InDelta(t, 40, measured["ratio"], 1e-9)
	require.InDelta(t, 20, measured["extra"].(map[string]any)["peak_rss_mb"], 0)
	check := scenario["targets"].([]any)[0].(map[string]any)
	require.Equal(t, false, check["pass"])
	require.Equal(t, ">=", check["op"])
	require.InDelta(t, -0.2, check["margin"], 1e-9)

	var b strings.Builder
	misses, err := r.Summary(&b)
	require.NoError(t, err)
	require.Equal(t, 1, misses)
	require.Contains(t, b.String(), "[rebuild] MISS  rebuild >= 50,000 events/s: 40,000 events/s (batch=500), 20% short")
	require.Contains(t, b.String(), "== time per scenario (s) ==\nrebuild        12\n")
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	o, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	require.Equal(t, scenarioNames(), o.scenarios)
	require.False(t, o.quick)
	require.False(t, o.cpuProfile)
	require.Equal(t, "bench-results", o.out)
	require.Equal(t, filepath.Join("bench-results", "pprof"), o.pprofDir)

	o, err = parseFlags([]string{"-quick", "-scenario", "latency, rebuild,latency", "-pprof-dir", "/tmp/p"}, io.Discard)
	require.NoError(t, err)
	require.True(t, o.quick)
	require.Equal(t, []string{"latency", "rebuild"}, o.scenarios)
	require.True(t, o.cpuProfile, "-pprof-dir implies -cpuprofile")

	_, err = parseFlags([]string{"-scenario", "speed"}, io.Discard)
	require.ErrorContains(t, err, `-scenario "speed": use all or rebuild, latency, append, idle, fanout, recovery, park, dlstall, bluegreen, status, horizon, partitions, cqrs, scaleout, console, fleet`)
	_, err = parseFlags([]string{"-from-json", "r.json"}, io.Discard)
	require.ErrorContains(t, err, "-from-json needs -write-docs")
	o, err = parseFlags([]string{"-write-docs", "docs/performance.md", "-from-json", "r.json"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "docs/performance.md", o.writeDocs)
	require.Equal(t, "r.json", o.fromJSON)
	_, err = parseFlags([]string{"-log-level", "loud"}, io.Discard)
	require.ErrorContains(t, err, "-log-level")
	_, err = parseFlags([]string{"extra"}, io.Discard)
	require.ErrorContains(t, err, "unexpected arguments")
	require.Equal(t, relay.MinIntervalDefault, o.relayInterval)
	o, err = parseFlags([]string{"-relay-interval", "20ms"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 20*time.Millisecond, o.relayInterval)
	_, err = parseFlags([]string{"-relay-interval", "0s"}, io.Discard)
	require.ErrorContains(t, err, "-relay-interval 0s: must be positive")
	require.Equal(t, liveWarmupDefault, o.liveWarmup)
	o, err = parseFlags([]string{"-live-warmup", "0s"}, io.Discard)
	require.NoError(t, err)
	require.Zero(t, o.liveWarmup)
	o, err = parseFlags([]string{"-quick"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, liveWarmupQuick, o.liveWarmup, "-quick warms up shorter")
	o, err = parseFlags([]string{"-quick", "-live-warmup", "2s"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 2*time.Second, o.liveWarmup, "unless told")
	_, err = parseFlags([]string{"-live-warmup", "-1s"}, io.Discard)
	require.ErrorContains(t, err, "-live-warmup -1s: must not be negative")

	require.Less(t, sizesFor(true).rebuildEvents, sizesFor(false).rebuildEvents)
	require.Less(t, sizesFor(true).statusEvents, sizesFor(false).statusEvents)
	require.Less(t, sizesFor(true).horizonEvents, sizesFor(false).horizonEvents)
	require.Less(t, sizesFor(true).partitionEvents, sizesFor(false).partitionEvents)
	require.Less(t, sizesFor(true).scaleOutEvents, sizesFor(false).scaleOutEvents)
	require.Contains(t, sizesFor(true).scaleOutWorkers, 4, "the scale-out target is checked at 4 workers")
	require.Contains(t, sizesFor(false).scaleOutWorkers, 4, "the scale-out target is checked at 4 workers")
	require.False(t, needsAMQP([]string{"rebuild", "status", "horizon", "partitions", "scaleout"}))
	require.True(t, needsAMQP([]string{"status", "latency"}))
}

func TestRedactArgs(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"-amqp=amqp://guest:xxxxx@host:5672/", "-quick", "-postgres", "postgres://u:xxxxx@h/db"},
		redact.Args([]string{"-amqp=amqp://guest:secret@host:5672/", "-quick", "-postgres", "postgres://u:pw@h/db"}))
}
