package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	chpg "github.com/nudgeworks/nudge/channel/postgres"
)

// runMainEnv makes the test binary run the CLI's main instead of the tests, so a test can send
// a real signal to a real process.
const runMainEnv = "NUDGE_CLI_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// TestInterruptExitCodes: a command ended by Ctrl-C exits 130, by SIGTERM 143, whether it
// was watching, waiting for a worker or had nothing left to do; a waiting command says what
// goes on without it.
func TestInterruptExitCodes(t *testing.T) {
	t.Parallel()
	f := newStatusFixture(t)
	for _, tc := range []struct {
		sig  syscall.Signal
		code int
	}{{syscall.SIGINT, 130}, {syscall.SIGTERM, 143}} {
		ctx, cancel := context.WithCancelCause(context.Background())
		stdout, stderr, wait := startCLI(t, ctx, f.env, "status", "--watch", "--interval", "100ms")
		require.Eventually(t, func() bool { return strings.Contains(stdout.String(), "PROJECTION") }, 20*time.Second, 10*time.Millisecond,
			"stderr: %s", stderr)
		cancel(&signalError{sig: tc.sig})
		require.Equal(t, tc.code, wait(10*time.Second), tc.sig)
		require.Empty(t, stderr.String(), "a watch has nothing to report")
	}

	ch, err := chpg.New(f.db.Pool, chpg.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	require.NoError(t, ch.Declare(context.Background(), "lagging", "failing"))
	for _, args := range [][]string{
		{"rebuild", "lagging"},
		{"skip", "failing", "--event", f.events[2].ID.String(), "--reason", "x"},
	} {
		ctx, cancel := context.WithCancelCause(context.Background())
		stdout, stderr, wait := startCLI(t, ctx, f.env, args...)
		require.Eventually(t, func() bool { return strings.Contains(stdout.String(), "asked the worker") }, 20*time.Second, 10*time.Millisecond,
			"%v: %s", args, stderr)
		cancel(&signalError{sig: syscall.SIGINT})
		require.Equal(t, 130, wait(10*time.Second), args)
		require.Contains(t, stderr.String(), "interrupted: stopped waiting, not the", args)
	}

	// Interrupted before it could notice: still 130.
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(&signalError{sig: syscall.SIGINT})
	_, stderr, wait := startCLI(t, ctx, f.env, "deadletter", "list")
	require.Equal(t, 130, wait(10*time.Second))
	require.Contains(t, stderr.String(), "nudge: stopped by SIGINT: connect to PostgreSQL at ")
}

// TestSignalsEndTheProcess sends real signals to the CLI, run as a process of its own.
func TestSignalsEndTheProcess(t *testing.T) {
	t.Parallel()
	f := newStatusFixture(t)
	for _, tc := range []struct {
		sig  os.Signal
		code int
	}{{os.Interrupt, 130}, {syscall.SIGTERM, 143}} {
		cmd := exec.Command(os.Args[0], "status", "--watch", "--interval", "100ms")
		cmd.Env = append(os.Environ(), runMainEnv+"=1", envDatabaseURL+"="+f.db.URL)
		var stdout, stderr syncBuffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Start())
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		require.Eventually(t, func() bool { return strings.Contains(stdout.String(), "PROJECTION") }, 30*time.Second, 10*time.Millisecond,
			"stderr: %s", &stderr)
		require.NoError(t, cmd.Process.Signal(tc.sig))
		select {
		case err := <-done:
			var exitErr *exec.ExitError
			require.True(t, errors.As(err, &exitErr), "%v: %v", tc.sig, err)
			require.Equal(t, tc.code, exitErr.ExitCode(), "%v; stderr: %s", tc.sig, &stderr)
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatalf("nudge status --watch did not end on %v", tc.sig)
		}
	}
}
