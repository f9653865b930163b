package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// testMarker marks a shell block that internal/readme's tests run.
const testMarker = "<!-- test -->"

// cliReference renders docs/reference/cli.md: it builds cmd/nudge and runs `nudge help`,
// then `nudge help <command>` for every command the main help lists.
func cliReference(root, _ string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tmp, err := os.MkdirTemp("", "docgen-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	bin := filepath.Join(tmp, "nudge")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/nudge")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build cmd/nudge: %w\n%s", err, out)
	}
	help := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, bin, append([]string{"help"}, args...)...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no NUDGE_* from this shell in the page
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("nudge help %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}
	main, err := help()
	if err != nil {
		return nil, err
	}
	commands := listedCommands(main)
	if len(commands) == 0 {
		return nil, fmt.Errorf("nudge help lists no commands under \"Commands:\":\n%s", main)
	}
	var b bytes.Buffer
	b.WriteString(generatedHeader("CLI reference", "the help of the nudge command (nudge help, nudge help <command>)"))
	b.WriteString("The operator's command, `go install github.com/nudgeworks/nudge/cmd/nudge@latest`. " +
		"Each section below is what `nudge help <command>` prints; `nudge <command> --help` prints the same.\n\n")
	b.WriteString(testMarker + "\n")
	fence(&b, "sh", "nudge help\nnudge status --help")
	b.WriteString("\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "- [nudge %s](#%s)\n", c, slug("nudge "+c))
	}
	b.WriteString("\n## nudge\n\n")
	fence(&b, "text", main)
	for _, c := range commands {
		text, err := help(strings.Fields(c)...)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "\n## nudge %s\n\n", c)
		fence(&b, "text", text)
	}
	return b.Bytes(), nil
}

// listedCommands returns the commands the main help lists under "Commands:" (a command
// and its subcommand, as "deadletter list"), without help itself.
func listedCommands(usage string) []string {
	var (
		out  []string
		in   bool
		seen = map[string]bool{}
	)
	for _, line := range strings.Split(usage, "\n") {
		switch {
		case strings.TrimSpace(line) == "Commands:":
			in = true
			continue
		case !in:
			continue
		case strings.TrimSpace(line) == "":
			return out
		case !strings.HasPrefix(line, "  ") || strings.HasPrefix(line, "   "):
			continue // a continuation line
		}
		// The name is the first column: text up to a run of spaces.
		name, _, _ := strings.Cut(strings.TrimSpace(line), "  ")
		var words []string
		for _, w := range strings.Fields(name) {
			if !isCommandWord(w) {
				break
			}
			words = append(words, w)
		}
		if len(words) == 0 || words[0] == "help" {
			continue
		}
		if len(words) > 1 && !seen[words[0]] { // a group of commands has a help of its own
			seen[words[0]] = true
			out = append(out, words[0])
		}
		if c := strings.Join(words, " "); !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	return out
}

// isCommandWord says whether w is a command's name: lower-case letters and -.
func isCommandWord(w string) bool {
	for _, r := range w {
		if (r < 'a' || r > 'z') && r != '-' {
			return false
		}
	}
	return w != ""
}
