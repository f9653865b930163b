package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func docsReport(started time.Time, commit string, names ...string) *Report {
	r := &Report{Format: ReportFormat, StartedAt: started, Quick: true,
		Machine: Machine{CPUModel: "Test CPU", CPUs: 2, GOMAXPROCS: 2, Commit: commit, PostgreSQL: "17.0"}}
	for _, n := range names {
		r.Scenarios = append(r.Scenarios, &Section{Name: n, Title: n + " title", StartedAt: started,
			Metrics: []Metric{{Case: "base", Name: "events_per_s", Unit: "events/s", Value: 1000},
				Metric{Case: "with | pipe", Name: "events_per_s", Unit: "events/s", Value: 500}.WithBaseline("base", 1000)},
			Checks: []Check{targetIdleCost.Check("woken", 0.2)}, Notes: []string{"a note"}})
	}
	return r
}

// TestWritePerformancePage: a run rewrites the sections of the scenarios it ran, keeps the
// others, and orders them as the harness does; each names machine, commit and date.
func TestWritePerformancePage(t *testing.T) {
	t.Parallel()
	page := filepath.Join(t.TempDir(), "docs", "performance.md")
	first := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	_, err := writeDocs(page, docsReport(first, "aaaaaaaaaaaaaaaa", "idle", "append"))
	require.NoError(t, err)
	second := first.Add(24 * time.Hour)
	_, err = writeDocs(page, docsReport(second, "bbbbbbbbbbbbbbbb", "idle", "rebuild"))
	require.NoError(t, err)

	data, err := os.ReadFile(page)
	require.NoError(t, err)
	text := string(data)
	require.True(t, strings.HasPrefix(text, performanceIntro), "the intro opens the page")
	sections := parseSections(text)
	require.Len(t, sections, 3, "rebuild added, idle replaced, append kept:\n%s", text)
	require.Contains(t, sections["append"], "commit `aaaaaaaaaaaa`", "a scenario not run keeps its section")
	require.Contains(t, sections["append"], "2026-01-02 03:04 UTC")
	require.Contains(t, sections["idle"], "commit `bbbbbbbbbbbb`", "a scenario run again is rewritten")
	require.Contains(t, sections["idle"], "Test CPU, 2 cores")
	require.NotContains(t, sections["idle"], "aaaaaaaaaaaa")
	require.Contains(t, sections["idle"], `with \| pipe`)
	require.Contains(t, sections["idle"], "0.5×")
	require.Less(t, strings.Index(text, "## rebuild:"), strings.Index(text, "## append:"), "sections in the harness's order")
	require.Less(t, strings.Index(text, "## append:"), strings.Index(text, "## idle:"))

	jsons, err := filepath.Glob(filepath.Join(filepath.Dir(page), "bench", "bench-*.json"))
	require.NoError(t, err)
	require.Len(t, jsons, 2, "each run's results are kept beside the page")
	r, err := readReport(jsons[1])
	require.NoError(t, err)
	require.Empty(t, r.LogFile, "no path of the measuring machine in the kept results")
	require.Contains(t, sections["idle"], "(bench/"+filepath.Base(jsons[1])+")")
}

// TestPerformancePageMatchesResults: docs/performance.md is what the results kept in
// docs/bench/ render to, merged in the order they were measured: no figure on the page was
// typed by hand.
func TestPerformancePageMatchesResults(t *testing.T) {
	t.Parallel()
	docs := filepath.Join("..", "..", "docs")
	want, err := os.ReadFile(filepath.Join(docs, "performance.md"))
	require.NoError(t, err)
	results, err := filepath.Glob(filepath.Join(docs, "bench", "bench-*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, results, "docs/performance.md without the results it shows in docs/bench/")
	page := filepath.Join(t.TempDir(), "performance.md")
	for _, path := range results { // Glob sorts: the names are start times
		r, err := readReport(path)
		require.NoError(t, err)
		require.NoError(t, writePerformancePage(page, r, "bench/"+filepath.Base(path)))
	}
	got, err := os.ReadFile(page)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got),
		"docs/performance.md differs from its results in docs/bench/: rewrite it with make bench (or go run ./internal/bench -write-docs docs/performance.md -from-json FILE), do not edit it")
}
