package readme_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// shellLangs are the info strings of shell blocks.
var shellLangs = []string{"sh", "bash", "shell", "console"}

// TestShellBlocks runs every shell block of README.md and docs/**/*.md that the line
// <!-- test --> precedes, with bash -e in the repository's root and a nudge built from
// cmd/nudge first on the PATH: each must exit 0. Mark only blocks that need no server and
// change nothing (nudge help, make help, go doc).
func TestShellBlocks(t *testing.T) {
	t.Parallel()
	type marked struct {
		file string
		b    block
	}
	var blocks []marked
	for _, file := range markdownFiles(t, "CONTRIBUTING.md", "RELIABILITY.md") {
		for _, b := range parseMarkdown(t, file).blocks {
			if b.tested {
				require.Contains(t, shellLangs, b.lang, "%s line %d: %s marks a %q block; only shell blocks run", file, b.line, testMarker, b.lang)
				blocks = append(blocks, marked{file, b})
			}
		}
	}
	if len(blocks) == 0 {
		t.Skip("no shell block is marked " + testMarker)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := t.TempDir()
	abs, err := filepath.Abs(root)
	require.NoError(t, err)
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(bin, "nudge"), "./cmd/nudge")
	build.Dir = abs
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build cmd/nudge:\n%s", out)
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "PATH=") || strings.HasPrefix(kv, "NUDGE_")
	})
	env = append(env, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	for _, m := range blocks {
		cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", shellScript(m.b.code))
		cmd.Dir, cmd.Env = abs, env
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s line %d: the block failed:\n%s\noutput:\n%s", m.file, m.b.line, m.b.code, out)
		require.NotEmpty(t, strings.TrimSpace(string(out)), "%s line %d: the block printed nothing", m.file, m.b.line)
	}
}

// shellScript is the script of a shell block: a leading "$ " prompt removed, lines without
// one dropped as output when any line has one.
func shellScript(code string) string {
	lines := strings.Split(code, "\n")
	prompted := slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "$ ") })
	if !prompted {
		return code
	}
	var out []string
	for _, l := range lines {
		if cmd, ok := strings.CutPrefix(l, "$ "); ok {
			out = append(out, cmd)
		}
	}
	return strings.Join(out, "\n")
}

func TestShellScript(t *testing.T) {
	t.Parallel()
	require.Equal(t, "nudge help\nmake help\n", shellScript("nudge help\nmake help\n"))
	require.Equal(t, "nudge version\ngo doc ./worker", shellScript("$ nudge version\nnudge v1.2.3\n$ go doc ./worker\npackage worker\n"))
}
