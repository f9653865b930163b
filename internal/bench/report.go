package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// ReportFormat is the version of the JSON report's shape; it changes when a field changes
// meaning or disappears (adding fields does not change it).
const ReportFormat = 1

// Report is the machine-readable result of one run, written as JSON to the -out directory.
type Report struct {
	Format    int       `json:"format"`
	StartedAt time.Time `json:"started_at"`
	// DurationSeconds is the wall time of the whole run.
	DurationSeconds float64 `json:"duration_s"`
	Quick           bool    `json:"quick"`
	// Args are the command-line arguments (URLs redacted).
	Args      []string   `json:"args"`
	Machine   Machine    `json:"machine"`
	Scenarios []*Section `json:"scenarios"`
	// LogFile holds the library's own logs during the run (-log-level).
	LogFile string `json:"log_file,omitempty"`
}

// stampLayout names a run's files after its start time (UTC).
const stampLayout = "20060102T150405Z"

// Section is the result of one scenario: its measurements, each beside the baseline measured in
// the same run, and the targets checked against them.
type Section struct {
	Name  string `json:"name"`
	Title string `json:"title"`
	// Params are the scenario's sizes (events, rates, durations, batch sizes, …).
	Params    map[string]any `json:"params"`
	StartedAt time.Time      `json:"started_at"`
	// DurationSeconds is the scenario's wall time, set-up included.
	DurationSeconds float64 `json:"duration_s"`
	// GoCPUSeconds is the CPU time (user + system) this process used during the scenario; the
	// servers' CPU is not in it.
	GoCPUSeconds float64 `json:"go_cpu_s"`
	// CPUProfile is the path of the scenario's CPU profile, when -cpuprofile was given.
	CPUProfile string   `json:"cpu_profile,omitempty"`
	Metrics    []Metric `json:"metrics"`
	Checks     []Check  `json:"targets"`
	Notes      []string `json:"notes,omitempty"`
	// Error says why the scenario stopped early; its metrics so far are kept.
	Error string `json:"error,omitempty"`

	table *Table // what the terminal shows; the metrics hold the same figures
}

// Metric is one measured figure of one case, with the baseline it is compared to.
type Metric struct {
	// Case names what was measured, e.g. "per-event batch=500" or "amqp projections=10".
	Case string `json:"case"`
	// Name is the figure, e.g. "events_per_s" or "p99_ms".
	Name  string  `json:"name"`
	Unit  string  `json:"unit"`
	Value float64 `json:"value"`
	// Baseline is the case this one is compared to, measured in the same run; empty for a
	// baseline itself.
	Baseline      string  `json:"baseline,omitempty"`
	BaselineValue float64 `json:"baseline_value,omitempty"`
	// Ratio is Value / BaselineValue.
	Ratio float64 `json:"ratio,omitempty"`
	// Extra holds further figures of the same case (p50_ms, peak_rss_mb, …).
	Extra map[string]float64 `json:"extra,omitempty"`
}

// WithBaseline returns m compared to the baseline case with value v.
func (m Metric) WithBaseline(baselineCase string, v float64) Metric {
	m.Baseline, m.BaselineValue, m.Ratio = baselineCase, v, Ratio(m.Value, v)
	return m
}

// Ratio returns a/b, or 0 when b is 0 (no baseline to compare to).
func Ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Op says which way a target goes.
type Op string

// The target directions.
const (
	// AtLeast: the measured value must be at least the threshold (throughputs).
	AtLeast Op = ">="
	// AtMost: the measured value must be at most the threshold (latencies, memory, costs).
	AtMost Op = "<="
)

// Target is a goal a measurement is checked against.
type Target struct {
	// Name says what is checked, e.g. "per-event rebuild".
	Name      string
	Op        Op
	Threshold float64
	Unit      string
}

// Check is a target checked against a measurement.
type Check struct {
	Target    string  `json:"target"`
	Op        Op      `json:"op"`
	Threshold float64 `json:"threshold"`
	Unit      string  `json:"unit"`
	// Case is what was measured (the best batch size, say).
	Case string  `json:"case"`
	Got  float64 `json:"got"`
	Pass bool    `json:"pass"`
	// Margin is how far Got is on the good side of the threshold, relative to it: 0.22 is 22 %
	// to spare, -0.10 is 10 % short. 0 when the threshold is 0. (For a target in %, the
	// terminal shows the gap in percentage points: Margin × Threshold.)
	Margin float64 `json:"margin"`
	// Missing is set when the measurement could not be made (the scenario failed); Pass is false.
	Missing bool `json:"missing,omitempty"`
}

// about returns t with what it is about added to its name.
func (t Target) about(what string) Target {
	t.Name += ", " + what
	return t
}

// Check evaluates t against got, measured in case c.
func (t Target) Check(c string, got float64) Check {
	ch := Check{Target: t.Name, Op: t.Op, Threshold: t.Threshold, Unit: t.Unit, Case: c, Got: got}
	switch t.Op {
	case AtLeast:
		ch.Pass = got >= t.Threshold
		if t.Threshold != 0 {
			ch.Margin = (got - t.Threshold) / math.Abs(t.Threshold)
		}
	case AtMost:
		ch.Pass = got <= t.Threshold
		if t.Threshold != 0 {
			ch.Margin = (t.Threshold - got) / math.Abs(t.Threshold)
		}
	}
	return ch
}

// Missed is the check of a target whose measurement could not be made.
func (t Target) Missed(why string) Check {
	return Check{Target: t.Name, Op: t.Op, Threshold: t.Threshold, Unit: t.Unit, Case: why, Missing: true}
}

// String formats the check for the terminal, e.g.
// "PASS  rebuild >= 50,000 events/s: 61,234 events/s (batch=1000), 22% to spare".
func (c Check) String() string {
	verdict := "MISS"
	if c.Pass {
		verdict = "PASS"
	}
	head := fmt.Sprintf("%s  %s %s %s", verdict, c.Target, c.Op, WithUnit(c.Threshold, c.Unit))
	if c.Missing {
		return fmt.Sprintf("%s: not measured (%s)", head, c.Case)
	}
	s := fmt.Sprintf("%s: %s", head, WithUnit(c.Got, c.Unit))
	if c.Case != "" {
		s += " (" + c.Case + ")"
	}
	switch {
	case c.Unit == "%": // a share already: the gap in percentage points reads better
		if gap := c.Margin * c.Threshold; gap < 0 {
			s += fmt.Sprintf(", %.1f points over", -gap)
		} else {
			s += fmt.Sprintf(", %.1f points to spare", gap)
		}
	case c.Threshold == 0:
	case c.Margin < 0:
		s += fmt.Sprintf(", %.0f%% short", -100*c.Margin)
	default:
		s += fmt.Sprintf(", %.0f%% to spare", 100*c.Margin)
	}
	return s
}

// WithUnit formats v with its unit: "50,000 events/s", "12.5 ms", "30.0×", "8.0%".
func WithUnit(v float64, unit string) string {
	switch unit {
	case "×", "%", "":
		return FormatValue(v, unit)
	}
	return FormatValue(v, unit) + " " + unit
}

// FormatValue formats v for a table cell in unit: throughputs with thousands separators,
// milliseconds and megabytes with one decimal (two below 10 ms), ratios as "3.2×" (two
// significant digits below 0.1: "0.014×").
func FormatValue(v float64, unit string) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "—"
	case unit == "×" && v != 0 && math.Abs(v) < 0.1:
		return strconv.FormatFloat(v, 'g', 2, 64) + "×"
	case unit == "×":
		return fmt.Sprintf("%.1f×", v)
	case unit == "%":
		return fmt.Sprintf("%.1f%%", v)
	case unit == "ms" && math.Abs(v) < 10:
		return fmt.Sprintf("%.2f", v)
	case unit == "cores":
		return fmt.Sprintf("%.2f", v)
	case unit == "ms", unit == "MB", unit == "s":
		return fmt.Sprintf("%.1f", v)
	default:
		return Thousands(int64(math.Round(v)))
	}
}

// Thousands formats n with commas between groups of three digits: 1234567 → "1,234,567".
func Thousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// Table is a terminal table: the first column is left-aligned, the others right-aligned.
type Table struct {
	Header []string
	Rows   [][]string
}

// Add appends a row.
func (t *Table) Add(cells ...string) { t.Rows = append(t.Rows, cells) }

// Write prints the table to w.
func (t *Table) Write(w io.Writer) error {
	widths := make([]int, len(t.Header))
	for _, row := range append([][]string{t.Header}, t.Rows...) {
		for i, c := range row {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	line := func(row []string) string {
		var b strings.Builder
		for i, c := range row {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			if i == 0 {
				b.WriteString(c + pad)
			} else {
				b.WriteString("  " + pad + c)
			}
		}
		return strings.TrimRight(b.String(), " ") + "\n"
	}
	var b strings.Builder
	b.WriteString(line(t.Header))
	total := 0
	for _, w := range widths {
		total += w + 2
	}
	b.WriteString(strings.Repeat("-", max(total-2, 0)) + "\n")
	for _, row := range t.Rows {
		b.WriteString(line(row))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Print writes the section to w: title, table, notes, targets.
func (s *Section) Print(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\n== %s: %s (%.0f s) ==\n", s.Name, s.Title, s.DurationSeconds)
	if s.table != nil && len(s.table.Rows) > 0 {
		if err := s.table.Write(&b); err != nil {
			return err
		}
	}
	for _, n := range s.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	if len(s.Checks) > 0 {
		b.WriteString("targets:\n")
		for _, c := range s.Checks {
			fmt.Fprintf(&b, "  %s\n", c)
		}
	}
	if s.Error != "" {
		fmt.Fprintf(&b, "ERROR: %s\n", s.Error)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// AddMetric records m.
func (s *Section) AddMetric(m Metric) { s.Metrics = append(s.Metrics, m) }

// AddCheck records the check of t against got, measured in case c.
func (s *Section) AddCheck(t Target, c string, got float64) {
	s.Checks = append(s.Checks, t.Check(c, got))
}

// Note adds a line printed under the table and kept in the JSON.
func (s *Section) Note(format string, args ...any) {
	s.Notes = append(s.Notes, fmt.Sprintf(format, args...))
}

// Summary prints every check of every section, and counts the misses; then each scenario's
// wall time.
func (r *Report) Summary(w io.Writer) (misses int, err error) {
	var b strings.Builder
	b.WriteString("\n== targets ==\n")
	for _, s := range r.Scenarios {
		for _, c := range s.Checks {
			if !c.Pass {
				misses++
			}
			fmt.Fprintf(&b, "[%s] %s\n", s.Name, c)
		}
		if s.Error != "" {
			fmt.Fprintf(&b, "[%s] ERROR: %s\n", s.Name, s.Error)
		}
	}
	b.WriteString("\n== time per scenario (s) ==\n")
	for _, s := range r.Scenarios {
		fmt.Fprintf(&b, "%-11s %5.0f\n", s.Name, s.DurationSeconds)
	}
	_, err = io.WriteString(w, b.String())
	return misses, err
}

// Write writes the report as indented JSON to dir (created if missing), in a file named after
// the run's start time, and returns its path.
func (r *Report) Write(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create the results directory: %w", err)
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", fmt.Errorf("encode the results: %w", err)
	}
	path := filepath.Join(dir, "bench-"+r.StartedAt.UTC().Format(stampLayout)+".json")
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return "", fmt.Errorf("write the results: %w", err)
	}
	return path, nil
}
