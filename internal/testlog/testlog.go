// Package testlog gives tests a *slog.Logger that writes through t.Log: a passing test prints
// nothing (unless go test runs with -v), a failing one shows the library's log lines beside its
// own, under its name.
//
// The level is info, or debug when NUDGE_TEST_LOG is set (to anything).
package testlog

import (
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
)

// LevelEnv names the environment variable that lowers the level to debug.
const LevelEnv = "NUDGE_TEST_LOG"

// New returns a logger for t at Level. Lines logged after t's cleanups have reached it (by a
// goroutine that outlives the test) are dropped, since t.Log would panic.
func New(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(NewWriter(t), &slog.HandlerOptions{Level: Level()}))
}

// Level returns the level of New: slog.LevelDebug when NUDGE_TEST_LOG is set, else
// slog.LevelInfo.
func Level() slog.Level {
	if os.Getenv(LevelEnv) != "" {
		return slog.LevelDebug
	}
	return slog.LevelInfo
}

// Writer writes each line it is given to t.Log, until it is closed.
type Writer struct {
	mu     sync.Mutex
	t      testing.TB
	closed bool
}

// NewWriter returns a Writer for t, closed when t's cleanups reach it: cleanups run last in,
// first out, so after those registered later (which stop what the test started).
func NewWriter(t testing.TB) *Writer {
	w := &Writer{t: t}
	t.Cleanup(w.Close)
	return w
}

// Write logs p, without its trailing newline, through t.Log.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

// Close drops every later line.
func (w *Writer) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
}
