package rabbitcluster

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/testwait"
)

// TestClusterOfTwoNodes: NewCluster starts two nodes that run as one cluster (each lists both
// as running), and Remove leaves neither process nor directory behind.
func TestClusterOfTwoNodes(t *testing.T) {
	t.Parallel()
	c := ForTest(t, 2)
	ctx := testwait.Context(t, 2*time.Minute)
	var limit syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &limit))
	want := min(uint64(OpenFilesDefault), limit.Max) // what each node's VM runs with
	require.Len(t, c.Nodes, 2)
	require.NotEqual(t, c.Nodes[0].Port(), c.Nodes[1].Port())
	names := []string{c.Nodes[0].Name(), c.Nodes[1].Name()}
	slices.Sort(names)
	for _, n := range c.Nodes {
		out, err := n.Ctl(ctx, "cluster_status", "--formatter", "json")
		require.NoError(t, err)
		var status struct {
			Running []string `json:"running_nodes"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &status), out)
		slices.Sort(status.Running)
		require.Equal(t, names, status.Running, "the running nodes %s sees", n.Name())
		require.Equal(t, want, beamOpenFiles(t, n), "the open files limit of %s's VM", n.Name())
	}

	c.Remove()
	for _, n := range c.Nodes {
		_, err := os.Stat(n.Dir())
		require.True(t, errors.Is(err, os.ErrNotExist), "%s is left: %v", n.Dir(), err)
		select {
		case <-n.done:
		default:
			t.Fatalf("node %s still runs after Remove", n.Name())
		}
	}
}

// TestNodeLimits: a node runs with the limit of open files Options.OpenFiles asks for,
// whatever this process's own limit, and with Options.HandshakeTimeout.
func TestNodeLimits(t *testing.T) {
	t.Parallel()
	ctx := testwait.Context(t, 5*time.Minute)
	n, err := Start(ctx, Options{OpenFiles: 4099, HandshakeTimeout: 45 * time.Second})
	if err != nil && os.Getenv("CI") != "true" && errors.Is(err, ErrNoServer) {
		t.Skip(err)
	}
	require.NoError(t, err)
	t.Cleanup(n.Remove)
	require.Equal(t, uint64(4099), beamOpenFiles(t, n))
	out, err := n.Ctl(ctx, "eval", "application:get_env(rabbit, handshake_timeout).")
	require.NoError(t, err)
	require.Equal(t, "{ok,45000}", strings.TrimSpace(out))
}

// beamOpenFiles returns the soft limit of open files of n's Erlang VM (beam.smp in n's process
// group), read from /proc.
func beamOpenFiles(t *testing.T, n *Node) uint64 {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	require.NoError(t, err)
	for _, stat := range stats {
		b, err := os.ReadFile(stat)
		if err != nil {
			continue // the process ended
		}
		// pid (comm) state ppid pgrp …: comm may hold spaces, so split after its ")".
		comm, rest, ok := strings.Cut(string(b), ") ")
		fields := strings.Fields(rest)
		if !ok || !strings.HasSuffix(comm, "(beam.smp") || len(fields) < 3 || fields[2] != strconv.Itoa(n.cmd.Process.Pid) {
			continue
		}
		limits, err := os.ReadFile(filepath.Join(filepath.Dir(stat), "limits"))
		require.NoError(t, err)
		for line := range strings.Lines(string(limits)) {
			if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
				soft, err := strconv.ParseUint(strings.Fields(rest)[0], 10, 64) // soft, hard, unit
				require.NoError(t, err, line)
				return soft
			}
		}
		t.Fatalf("%s has no open files limit", stat)
	}
	t.Fatalf("no beam.smp in the process group %d of node %s", n.cmd.Process.Pid, n.Name())
	return 0
}

// TestStartFailureLeavesNothing: a server that exits while starting fails Start with the path
// of its output, and its directory is removed.
func TestStartFailureLeavesNothing(t *testing.T) {
	bin := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bin, "rabbitmq-server"), []byte("#!/bin/sh\necho broken >&2\nexit 1\n"), 0o700))
	t.Setenv("NUDGE_TEST_RABBITMQ_BIN", bin)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // the node's directory goes here
	_, err := Start(testwait.Context(t, time.Minute), Options{})
	require.ErrorContains(t, err, "exited while starting")
	left, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.Empty(t, left, "the failed node's directory is left")
}
