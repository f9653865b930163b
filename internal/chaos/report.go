package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// check is one scenario-specific verdict.
type check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// grepResult is one search of the outputs for a secret.
type grepResult struct {
	Pattern string   `json:"pattern"`
	Files   int      `json:"files"`
	Hits    int      `json:"hits"`
	Where   []string `json:"where,omitempty"` // file:line of the first hits
}

// result is what a scenario reports.
type result struct {
	Scenario string `json:"scenario"`
	Passed   bool   `json:"passed"`
	// Faults counts the faults injected; FaultKind says what they were.
	Faults    int    `json:"faults"`
	FaultKind string `json:"fault_kind"`
	// Appended counts the events committed to the store; Acked those whose append returned
	// success to a writer (the difference: appends whose reply was lost but that committed).
	Appended      int           `json:"appended"`
	Acked         int           `json:"acked"`
	AppendRetries int64         `json:"append_retries"`
	Models        []modelResult `json:"models"`
	// Recover is the time from the end of the last fault until every projection had handled
	// every event readable then; negative when not measured.
	Recover     time.Duration       `json:"recover_ns"`
	Took        time.Duration       `json:"took_ns"`
	Checks      []check             `json:"checks,omitempty"`
	DeadLetters []deadLetterSummary `json:"dead_letters,omitempty"`
	Greps       []grepResult        `json:"greps,omitempty"`
	Notes       []string            `json:"notes,omitempty"`
	Error       string              `json:"error,omitempty"`
	Logs        string              `json:"logs,omitempty"`
}

// deadLetterSummary summarises one dead-letter record.
type deadLetterSummary struct {
	ID          int64  `json:"id"`
	Projection  string `json:"projection"`
	Status      string `json:"status"`
	Count       int    `json:"count"`
	MessageUUID string `json:"message_uuid,omitempty"`
	FailingID   string `json:"failing_event_id,omitempty"`
	Error       string `json:"error"`
}

// addCheck records a check.
func (r *result) addCheck(name string, ok bool, format string, args ...any) {
	r.Checks = append(r.Checks, check{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
}

// finish decides whether the scenario passed.
func (r *result) finish() {
	r.Passed = r.Error == "" && len(r.Models) > 0
	for _, m := range r.Models {
		r.Passed = r.Passed && m.ok()
	}
	for _, c := range r.Checks {
		r.Passed = r.Passed && c.OK
	}
}

// line is the scenario's one-line summary.
func (r *result) line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-17s faults=%d %s  appended=%d  projected", r.Scenario, r.Faults, r.FaultKind, r.Appended)
	if len(r.Models) > 3 {
		return r.fleetLine(&b)
	}
	sep := " "
	for _, m := range r.Models {
		fmt.Fprintf(&b, "%s%s:%d", sep, shortName(m.Name), m.Projected)
		sep = ","
	}
	return r.lineRest(&b)
}

// fleetLine finishes the summary of a scenario with many read models: the least and most
// events projected and the longest max lag over them.
func (r *result) fleetLine(b *strings.Builder) string {
	lo, hi, lag := r.Models[0].Projected, 0, time.Duration(0)
	for _, m := range r.Models {
		lo, hi, lag = min(lo, m.Projected), max(hi, m.Projected), max(lag, m.MaxLag)
	}
	fmt.Fprintf(b, " %d models:%d–%d", len(r.Models), lo, hi)
	return r.lineRest(b, lag)
}

// lineRest writes the summary from the missing count on; maxLag, if given, replaces the
// models' max lags.
func (r *result) lineRest(b *strings.Builder, maxLag ...time.Duration) string {
	missing, dup, wrong := 0, 0, 0
	for _, m := range r.Models {
		missing += m.Missing + m.Unknown
		wrong += m.Mismatched + m.OutOfOrder
		if m.ExactlyOnce {
			dup += m.Duplicated
		}
	}
	fmt.Fprintf(b, "  missing=%d  duplicated(exactly-once)=%d  wrong(content,order)=%d  max_lag", missing, dup, wrong)
	sep := " "
	if len(maxLag) > 0 {
		fmt.Fprintf(b, " %s", round(maxLag[0]))
	} else {
		for _, m := range r.Models {
			fmt.Fprintf(b, "%s%s:%s", sep, shortName(m.Name), round(m.MaxLag))
			sep = ","
		}
	}
	rec := "n/a"
	if r.Recover >= 0 {
		rec = round(r.Recover)
	}
	fmt.Fprintf(b, "  recover=%s  took=%s  ", rec, r.Took.Round(time.Second))
	if r.Passed {
		b.WriteString("PASS")
		return b.String()
	}
	b.WriteString("FAIL")
	var why []string
	if r.Error != "" {
		why = append(why, r.Error)
	}
	for _, m := range r.Models {
		if !m.ok() {
			why = append(why, fmt.Sprintf("%s: %d missing, %d unknown, %d duplicated, %d with other content, %d out of stream order",
				m.Name, m.Missing, m.Unknown, m.Duplicated, m.Mismatched, m.OutOfOrder))
		}
	}
	for _, c := range r.Checks {
		if !c.OK {
			why = append(why, c.Name+": "+c.Detail)
		}
	}
	fmt.Fprintf(b, " (%s)", strings.Join(why, "; "))
	return b.String()
}

// shortName drops the models' common "chaos_" prefix.
func shortName(name string) string { return strings.TrimPrefix(name, "chaos_") }

// round shows a duration with two significant decimals of a second.
func round(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	default:
		return d.Round(time.Millisecond).String()
	}
}

// runReport is the JSON file of a run.
type runReport struct {
	Started time.Time     `json:"started"`
	Took    time.Duration `json:"took_ns"`
	Seed    uint64        `json:"seed"`
	Budget  time.Duration `json:"budget_ns"`
	// TimeoutScale multiplied the harness's deadlines (-timeout-scale).
	TimeoutScale float64   `json:"timeout_scale"`
	Rate         int       `json:"rate"`
	Passed       bool      `json:"passed"`
	Scenarios    []*result `json:"scenarios"`
}

// write writes the report to dir/results.json.
func (rr *runReport) write(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(rr, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "results.json")
	return path, os.WriteFile(path, append(b, '\n'), 0o644)
}
