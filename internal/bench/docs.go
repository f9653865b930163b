package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// performanceIntro opens docs/performance.md; the sections below it are the scenarios'.
const performanceIntro = `<!-- Written by ` + "`make bench`" + ` (go run ./internal/bench -write-docs docs/performance.md). Do not edit:
a run rewrites the sections of the scenarios it ran and keeps the others. -->

# Performance

What nudge costs and how fast it goes, measured by the benchmark harness (` + "`internal/bench`" + `)
against real PostgreSQL and RabbitMQ. Every figure stands beside a baseline measured in the same
run on the same machine (the ratio column), and each scenario says on which machine, at which
commit and when it was measured: figures from different sections may come from different runs.
The JSON results each section names are kept in [docs/bench/](bench/).

Reproduce one section: ` + "`make bench BENCH_FLAGS=\"-quick -scenario NAME\"`" + ` (` + "`-quick`" + `: small
sizes, as each section says). ` + "`go run ./internal/bench -h`" + ` and the harness's package comment
describe every scenario.
`

// sectionPrefix opens a scenario's section of the page: "## <name>: <title>".
const sectionPrefix = "## "

// writePerformancePage merges the report's scenarios into the page at path: a scenario it ran
// replaces its section, the others' sections stay, in the scenarios' order. jsonName is the
// results file the sections name, relative to the page.
func writePerformancePage(path string, r *Report, jsonName string) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("read %s: %w", path, err)
	}
	sections := parseSections(string(old))
	for _, s := range r.Scenarios {
		sections[s.Name] = renderSection(r, s, jsonName)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(assemblePage(sections)), 0o644)
}

// parseSections splits a page into its scenarios' sections, keyed by scenario name; the
// intro is dropped (it is written anew).
func parseSections(page string) map[string]string {
	out := map[string]string{}
	var name string
	var cur strings.Builder
	flush := func() {
		if name != "" {
			out[name] = strings.TrimRight(cur.String(), "\n") + "\n"
		}
		cur.Reset()
	}
	for _, line := range strings.SplitAfter(page, "\n") {
		if heading, ok := strings.CutPrefix(line, sectionPrefix); ok {
			flush()
			name, _, _ = strings.Cut(strings.TrimSpace(heading), ":")
		}
		if name != "" {
			cur.WriteString(line)
		}
	}
	flush()
	return out
}

// assemblePage writes the intro, then the sections: known scenarios in their order, then
// any other (a scenario since removed) by name.
func assemblePage(sections map[string]string) string {
	var b strings.Builder
	b.WriteString(performanceIntro)
	order := scenarioNames()
	var others []string
	for name := range sections {
		if !slices.Contains(order, name) {
			others = append(others, name)
		}
	}
	slices.Sort(others)
	for _, name := range append(order, others...) {
		if s, ok := sections[name]; ok {
			b.WriteString("\n" + s)
		}
	}
	return b.String()
}

// renderSection is one scenario's section: where and when it was measured, its figures
// beside their baselines, its targets and notes.
func renderSection(r *Report, s *Section, jsonName string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s%s: %s\n\n", sectionPrefix, s.Name, s.Title)
	b.WriteString(machineLine(r, s, jsonName) + "\n\n")
	if s.Error != "" {
		fmt.Fprintf(&b, "**The scenario failed:** %s\n\n", mdCell(s.Error))
	}
	if len(s.Metrics) > 0 {
		b.WriteString("| Case | Figure | Value | Baseline | Baseline value | Ratio |\n|---|---|--:|---|--:|--:|\n")
		for _, m := range s.Metrics {
			base, baseValue, ratio := "—", "—", "—"
			if m.Baseline != "" {
				base, baseValue, ratio = mdCell(m.Baseline), WithUnit(m.BaselineValue, m.Unit), FormatValue(m.Ratio, "×")
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", mdCell(m.Case), mdCell(m.Name), WithUnit(m.Value, m.Unit), base, baseValue, ratio)
		}
		b.WriteString("\n")
	}
	if len(s.Checks) > 0 {
		b.WriteString("Targets:\n\n")
		for _, c := range s.Checks {
			fmt.Fprintf(&b, "- %s\n", mdCell(c.String()))
		}
		b.WriteString("\n")
	}
	for _, n := range s.Notes {
		fmt.Fprintf(&b, "> %s\n>\n", mdCell(n))
	}
	return strings.TrimRight(strings.TrimSuffix(b.String(), ">\n"), "\n") + "\n"
}

// machineLine says where, when and at which commit a section was measured.
func machineLine(r *Report, s *Section, jsonName string) string {
	m := r.Machine
	commit := m.Commit
	if len(commit) > 12 {
		commit = commit[:12]
	}
	if commit == "" {
		commit = "unknown"
	}
	if m.Dirty {
		commit += " (with uncommitted changes)"
	}
	sizes := "full sizes"
	if r.Quick {
		sizes = "-quick sizes"
	}
	cpu := m.CPUModel
	if cpu == "" {
		cpu = m.Arch
	}
	line := fmt.Sprintf("Measured %s (%.0f s, %s) on %s, %d cores (GOMAXPROCS %d), %d MB, %s %s; commit `%s`; PostgreSQL %s",
		s.StartedAt.UTC().Format("2006-01-02 15:04 MST"), s.DurationSeconds, sizes, cpu, m.CPUs, m.GOMAXPROCS, m.MemoryMB,
		m.OS, m.GoVersion, commit, cmpOr(m.PostgreSQL, "unknown"))
	if m.RabbitMQ != "" {
		line += ", RabbitMQ " + m.RabbitMQ
	}
	if len(m.LoadAverageStart) > 0 {
		line += fmt.Sprintf("; load average %.2f at the start", m.LoadAverageStart[0])
	}
	if jsonName != "" {
		line += fmt.Sprintf(". Results: [%s](%s).", filepath.Base(jsonName), filepath.ToSlash(jsonName))
	} else {
		line += "."
	}
	return line
}

// mdCell makes text safe in a Markdown table cell or list item.
func mdCell(s string) string {
	return strings.ReplaceAll(strings.Join(strings.Fields(s), " "), "|", `\|`)
}

// readReport reads a results file that run wrote.
func readReport(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if r.Format != ReportFormat {
		return nil, fmt.Errorf("%s: results format %d, this harness reads %d", path, r.Format, ReportFormat)
	}
	return &r, nil
}

// writeDocs keeps the report beside the page (in bench/ next to it) and merges its
// scenarios into the page.
func writeDocs(page string, r *Report) (string, error) {
	keep := *r
	keep.LogFile = "" // a path on the machine that ran it
	jsonPath, err := keep.Write(filepath.Join(filepath.Dir(page), "bench"))
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(filepath.Dir(page), jsonPath)
	if err != nil {
		return "", err
	}
	return jsonPath, writePerformancePage(page, r, rel)
}
