package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// Machine describes where the run happened, without naming the host.
type Machine struct {
	GoVersion  string `json:"go_version"`
	OS         string `json:"os"`
	Arch       string `json:"arch"`
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	CPUModel   string `json:"cpu_model,omitempty"`
	MemoryMB   int    `json:"memory_mb,omitempty"`
	Kernel     string `json:"kernel,omitempty"`
	// LoadAverage is the 1-, 5- and 15-minute load average when the run started and ended: a
	// busy machine shows here.
	LoadAverageStart []float64 `json:"load_average_start,omitempty"`
	LoadAverageEnd   []float64 `json:"load_average_end,omitempty"`
	PostgreSQL       string    `json:"postgresql,omitempty"`
	RabbitMQ         string    `json:"rabbitmq,omitempty"`
	// Commit is the git commit of the code measured; Dirty says the working tree had changes.
	Commit string `json:"commit,omitempty"`
	Dirty  bool   `json:"dirty,omitempty"`
}

// describeMachine collects what is known about this machine and the code; servers' versions are
// filled in by the caller.
func describeMachine(ctx context.Context) Machine {
	m := Machine{
		GoVersion:        runtime.Version(),
		OS:               runtime.GOOS,
		Arch:             runtime.GOARCH,
		CPUs:             runtime.NumCPU(),
		GOMAXPROCS:       runtime.GOMAXPROCS(0),
		LoadAverageStart: loadAverage(),
	}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		m.CPUModel = procField(data, "model name")
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(procField(data, "MemTotal"), "kB")))
		m.MemoryMB = kb / 1024
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(data))
	}
	m.Commit, m.Dirty = gitCommit(ctx)
	return m
}

// procField returns the value of the first "key: value" line of a /proc file with key.
func procField(data []byte, key string) string {
	for sc := bufio.NewScanner(bytes.NewReader(data)); sc.Scan(); {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// loadAverage returns the 1-, 5- and 15-minute load averages, nil where unknown.
func loadAverage() []float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return nil
	}
	fields := strings.Fields(string(data))
	if len(fields) < 3 {
		return nil
	}
	out := make([]float64, 3)
	for i := range out {
		out[i], _ = strconv.ParseFloat(fields[i], 64)
	}
	return out
}

// gitCommit returns the commit the binary was built from (stamped by go build) or, under
// go run, the working tree's HEAD and whether tracked files have changes.
func gitCommit(ctx context.Context) (string, bool) {
	if info, ok := debug.ReadBuildInfo(); ok {
		var rev string
		var dirty bool
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if rev != "" {
			return rev, dirty
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "git", "rev-parse", "HEAD").Output()
	if err != nil {
		return "", false
	}
	status, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--untracked-files=no").Output()
	return strings.TrimSpace(string(out)), err == nil && len(bytes.TrimSpace(status)) > 0
}
