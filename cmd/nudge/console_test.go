package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConsoleCommand: 'nudge console' serves the console from the CLI's connection settings,
// read-only by default (a POST is refused with 405), on the address it prints, and stops
// cleanly when its context ends.
func TestConsoleCommand(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, w := io.Pipe()
	code := make(chan int, 1)
	go func() {
		var stderr strings.Builder
		code <- run(ctx, []string{"console", "--listen", "127.0.0.1:0", "--base-path", "/ops"}, w, &stderr,
			func(k string) string { return f.env[k] })
		_ = w.Close()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	m := regexp.MustCompile(`http://\S+/`).FindString(line)
	require.NotEmpty(t, m, line)
	require.Contains(t, line, "read-only")
	go func() { _, _ = io.Copy(io.Discard, out) }()

	resp, err := http.Get(m + "deadletters/1")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.Contains(t, string(body), "OrderBad")
	require.NotContains(t, string(body), "<form", "no actions when read-only")

	resp, err = http.PostForm(m+"actions/resolve", url.Values{"id": {"1"}})
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)

	cancel()
	require.Equal(t, 0, <-code)
}

// TestConsoleListensOnLoopback: without --listen the console binds to loopback only.
func TestConsoleListensOnLoopback(t *testing.T) {
	t.Parallel()
	res := runCLI(t, nil, "console", "-h")
	require.Equal(t, 0, res.code)
	require.Regexp(t, `--listen address\n\s+address to serve on \(default "127\.0\.0\.1:8080"\)`, res.stdout)
	require.Contains(t, res.stdout, "pause and resume")
}
