package main

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestVersionText(t *testing.T) {
	t.Parallel()
	platform := " " + runtime.GOOS + "/" + runtime.GOARCH + "\n"

	released := &debug.BuildInfo{GoVersion: "go1.25.3", Main: debug.Module{Path: "github.com/nudgeworks/nudge", Version: "v0.4.1"}}
	require.Equal(t, "nudge v0.4.1\ngo       go1.25.3"+platform, versionText(released))

	devel := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/nudgeworks/nudge", Version: "(devel)"},
		Settings: []debug.BuildSetting{
			{Key: "-compiler", Value: "gc"},
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "3711982f0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f"},
			{Key: "vcs.time", Value: "2026-05-01T10:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		}}
	require.Equal(t, "nudge (devel)\n"+
		"commit   3711982f0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f\n"+
		"time     2026-05-01T10:00:00Z\n"+
		"modified yes: built with uncommitted changes\n"+
		"go       go1.26.0"+platform, versionText(devel))

	devel.Settings[4].Value = "false"
	require.NotContains(t, versionText(devel), "modified")
	require.Equal(t, "nudge (devel)\ngo       go1.25.0"+platform,
		versionText(&debug.BuildInfo{GoVersion: "go1.25.0"}), "a test binary has no main module version")
	require.Equal(t, "nudge (unknown: built without module information)\ngo       "+runtime.Version()+platform, versionText(nil))
}

func TestVersionCommand(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		// Even with a broken environment: version needs nothing else.
		res := runCLI(t, map[string]string{envSchema: "Not A Schema"}, args...)
		require.Equal(t, 0, res.code, "%v: %s", args, res.stderr)
		require.True(t, strings.HasPrefix(res.stdout, "nudge "), res.stdout)
		require.Contains(t, res.stdout, "\ngo       "+runtime.Version()+" ", args)
	}
	res := runCLI(t, nil, "version", "extra")
	require.Equal(t, 2, res.code)
	res = runCLI(t, nil, "help", "version")
	require.Equal(t, 0, res.code)
	require.Contains(t, res.stdout, "Usage: nudge version\n")
	require.NotContains(t, res.stdout, "Flags:")
}
