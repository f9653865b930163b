package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// readmeCommands returns the nudge command lines of the shell blocks of the README at path,
// split into arguments (double quotes group words), without the trailing comments.
func readmeCommands(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	var (
		commands [][]string
		inShell  bool
	)
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		line := scanner.Text()
		switch {
		case strings.HasPrefix(line, "```"):
			inShell = !inShell && strings.TrimPrefix(line, "```") == "sh"
		case inShell && strings.HasPrefix(line, "nudge "):
			if i := strings.Index(line, "  #"); i >= 0 {
				line = line[:i]
			}
			commands = append(commands, splitWords(t, strings.TrimPrefix(line, "nudge ")))
		}
	}
	require.NoError(t, scanner.Err())
	return commands
}

// splitWords splits s at spaces, keeping double-quoted words together.
func splitWords(t *testing.T, s string) []string {
	t.Helper()
	var (
		words  []string
		word   strings.Builder
		quoted bool
		inWord bool
	)
	for _, r := range s {
		switch {
		case r == '"':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	require.False(t, quoted, "unbalanced quotes in %q", s)
	if inWord {
		words = append(words, word.String())
	}
	return words
}

// TestREADMECommands runs every nudge command of the README's shell blocks, as written, against
// a database with dead letters and a projection whose worker runs: each must succeed, except the
// skip, which is refused because the projection is not failing on the event, and drop-retired,
// refused because its only version is active.
func TestREADMECommands(t *testing.T) {
	t.Parallel()
	commands := readmeCommands(t, "../../README.md")
	require.GreaterOrEqual(t, len(commands), 10, "the README's CLI block was found")

	s := newRebuildSetup(t, channelPostgres, &tickets{})
	var eventID string
	require.NoError(t, s.db.Pool.QueryRow(context.Background(),
		`SELECT event_id FROM nudge_events WHERE event_type = 'TicketOpened' ORDER BY global_position LIMIT 1`).Scan(&eventID))
	replace := strings.NewReplacer("ticket_list", "tickets", "<event-id>", eventID)

	var seen []string
	for _, words := range commands {
		args := make([]string, len(words))
		for i, w := range words {
			args[i] = replace.Replace(w)
		}
		name := strings.Join(args, " ")
		seen = append(seen, args[0])
		var code int
		var stdout, stderr fmt.Stringer
		if strings.Contains(name, "--watch") {
			// It runs until Ctrl-C: that comes once it has printed its first status.
			ctx, cancel := context.WithCancel(context.Background())
			out, errOut, wait := startCLI(t, ctx, s.env, args...)
			require.Eventually(t, func() bool { return out.String() != "" }, waitCLI, 10*time.Millisecond,
				"%s printed nothing; stderr: %s", name, errOut)
			cancel()
			code, stdout, stderr = wait(waitCLI), out, errOut
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), waitCLI)
			var out, errOut bytes.Buffer
			code, stdout, stderr = run(ctx, args, &out, &errOut, func(k string) string { return s.env[k] }), &out, &errOut
			cancel()
		}
		if args[0] == "skip" {
			require.Equal(t, 1, code, "%s\nstdout: %s\nstderr: %s", name, stdout.String(), stderr.String())
			require.Contains(t, stdout.String()+stderr.String(), "not failing", name)
			continue
		}
		if args[0] == "drop-retired" { // the projection has one version, active: nothing to drop
			require.Equal(t, 1, code, "%s\nstdout: %s\nstderr: %s", name, stdout.String(), stderr.String())
			require.Contains(t, stderr.String(), "is active, not retired", name)
			continue
		}
		require.Equal(t, 0, code, "%s\nstdout: %s\nstderr: %s", name, stdout.String(), stderr.String())
	}
	for _, cmd := range []string{"migrate", "status", "rebuild", "deadletter", "skip", "parked", "drop-retired"} {
		require.Contains(t, seen, cmd, "the README shows nudge %s", cmd)
	}
}
