package rabbitcluster

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/testwait"
)

// TestClusterOfTwoNodes: NewCluster starts two nodes that run as one cluster (each lists both
// as running), and Remove leaves neither process nor directory behind.
func TestClusterOfTwoNodes(t *testing.T) {
	c := ForTest(t, 2)
	ctx := testwait.Context(t, 2*time.Minute)
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
