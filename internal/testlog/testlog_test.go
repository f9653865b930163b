package testlog_test

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/testlog"
)

// recorder is a testing.TB that keeps what is logged through it.
type recorder struct {
	testing.TB
	lines    []string
	cleanups []func()
}

func (r *recorder) Log(args ...any)  { r.lines = append(r.lines, args[0].(string)) }
func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *recorder) Helper()          {}
func (r *recorder) runCleanups() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

func TestLinesGoToTLogUntilCleanup(t *testing.T) {
	t.Setenv(testlog.LevelEnv, "")
	r := &recorder{TB: t}
	log := testlog.New(r)
	log.Debug("hidden at the default level")
	log.Info("started", slog.String("projection", "alpha"))
	require.Len(t, r.lines, 1)
	require.Contains(t, r.lines[0], `msg=started projection=alpha`)
	require.NotContains(t, r.lines[0], "\n", "one line, without its newline")

	r.runCleanups()
	log.Error("after the test")
	require.Len(t, r.lines, 1, "lines after the cleanup are dropped")
}

func TestLevelEnv(t *testing.T) {
	t.Setenv(testlog.LevelEnv, "1")
	require.Equal(t, slog.LevelDebug, testlog.Level())
	t.Setenv(testlog.LevelEnv, "")
	require.Equal(t, slog.LevelInfo, testlog.Level())
}
