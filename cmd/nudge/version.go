package main

import (
	"errors"
	"flag"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

const versionDoc = `Prints the version of nudge: the module version it was built from, or "(devel)" for a build
from a source tree, with the commit, its time and whether the tree had uncommitted changes when
Go recorded them; and the Go version and platform it was built with.
`

func (c *cli) version(args []string) error {
	cmd := command{name: "version", synopsis: "", doc: versionDoc}
	fs := newFlagSet(cmd.name)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(c.stdout, fs, cmd)
			return errHelp
		}
		return usageErrorf("version: %s", flagError(fs, err))
	}
	if fs.NArg() > 0 {
		return usageErrorf("version takes no arguments, got %q", strings.Join(fs.Args(), " "))
	}
	info, _ := debug.ReadBuildInfo()
	fmt.Fprint(c.stdout, versionText(info))
	return nil
}

// versionText describes the build info (nil when the binary has none).
func versionText(info *debug.BuildInfo) string {
	version, goVersion := "(unknown: built without module information)", runtime.Version()
	settings := map[string]string{}
	if info != nil {
		version = info.Main.Version
		if version == "" {
			version = "(devel)"
		}
		if info.GoVersion != "" {
			goVersion = info.GoVersion
		}
		for _, s := range info.Settings {
			settings[s.Key] = s.Value
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "nudge %s\n", version)
	if rev := settings["vcs.revision"]; rev != "" {
		fmt.Fprintf(&b, "commit   %s\n", rev)
	}
	if at := settings["vcs.time"]; at != "" {
		fmt.Fprintf(&b, "time     %s\n", at)
	}
	if settings["vcs.modified"] == "true" {
		b.WriteString("modified yes: built with uncommitted changes\n")
	}
	fmt.Fprintf(&b, "go       %s %s/%s\n", goVersion, runtime.GOOS, runtime.GOARCH)
	return b.String()
}
