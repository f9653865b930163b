package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Latency summarises latency samples.
type Latency struct {
	Count int
	P50   time.Duration
	P90   time.Duration
	P99   time.Duration
	Max   time.Duration
	Mean  time.Duration
}

// Summarize sorts samples in place and summarises them; nearest-rank percentiles, so p99 of 100
// samples is the 99th smallest. An empty slice gives the zero Latency.
func Summarize(samples []time.Duration) Latency {
	if len(samples) == 0 {
		return Latency{}
	}
	slices.Sort(samples)
	var sum time.Duration
	for _, s := range samples {
		sum += s
	}
	return Latency{
		Count: len(samples),
		P50:   Percentile(samples, 0.50),
		P90:   Percentile(samples, 0.90),
		P99:   Percentile(samples, 0.99),
		Max:   samples[len(samples)-1],
		Mean:  sum / time.Duration(len(samples)),
	}
}

// Percentile returns the nearest-rank p-quantile (0 < p ≤ 1) of sorted samples: the smallest
// sample with at least p of all samples at or below it. It returns 0 for no samples.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// Ms converts d to milliseconds.
func Ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Extra returns the summary as the extra figures of a Metric.
func (l Latency) Extra() map[string]float64 {
	return map[string]float64{"p50_ms": Ms(l.P50), "p90_ms": Ms(l.P90), "p99_ms": Ms(l.P99),
		"max_ms": Ms(l.Max), "mean_ms": Ms(l.Mean), "samples": float64(l.Count)}
}

// errNoProc is returned where /proc/self is not available (not Linux).
var errNoProc = errors.New("/proc/self/status is not available")

// Memory is the process's resident set size, from /proc/self/status.
type Memory struct {
	// RSSMB is the current resident set size (VmRSS) in MB.
	RSSMB float64
	// PeakMB is the peak resident set size (VmHWM) in MB, since the process started or since
	// ResetPeakRSS.
	PeakMB float64
}

// ReadMemory reads the process's current and peak RSS.
func ReadMemory() (Memory, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return Memory{}, fmt.Errorf("%w: %w", errNoProc, err)
	}
	return ParseStatus(data)
}

// ParseStatus reads VmRSS and VmHWM out of the text of /proc/<pid>/status.
func ParseStatus(status []byte) (Memory, error) {
	var m Memory
	var seen int
	for sc := bufio.NewScanner(bytes.NewReader(status)); sc.Scan(); {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if !ok || (key != "VmRSS" && key != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(value), "kB")), 64)
		if err != nil {
			return Memory{}, fmt.Errorf("parse %s %q in /proc/self/status: %w", key, value, err)
		}
		if key == "VmRSS" {
			m.RSSMB = kb / 1024
		} else {
			m.PeakMB = kb / 1024
		}
		seen++
	}
	if seen != 2 {
		return Memory{}, fmt.Errorf("%w: VmRSS or VmHWM missing", errNoProc)
	}
	return m, nil
}

// ResetPeakRSS returns freed memory to the system and sets the peak RSS (VmHWM) back to the
// current RSS, so the next peak read belongs to what runs in between. Where the kernel does not
// allow it (the error says so), the peak stays the process's.
func ResetPeakRSS() error {
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return fmt.Errorf("reset the peak RSS through /proc/self/clear_refs: %w", err)
	}
	return nil
}

// ProcessCPU returns the CPU time (user + system) this process has used.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Rate returns n per second over d, or 0 for no time.
func Rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// mean returns the mean of xs, 0 for none.
func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// MachineBusy returns the CPU time every core of the machine spent busy since boot — user,
// nice, system, irq, softirq and steal in /proc/stat's cpu line, idle and iowait left out — or
// 0 where /proc/stat cannot be read. The growth over a window, over the window's length, is
// the cores the whole machine kept busy: the broker and everything else included.
func MachineBusy() time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return 0
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} { // user nice system [idle iowait] irq softirq steal
		n, err := strconv.ParseInt(fields[i], 10, 64)
		if err != nil {
			return 0
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks
}
