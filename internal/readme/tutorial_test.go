package readme_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgeworks/nudge/internal/amqptest"
	"github.com/nudgeworks/nudge/internal/pgtest"
	"github.com/nudgeworks/nudge/internal/testwait"
)

// tutorial is the getting-started page TestTutorial follows.
const tutorial = "docs/tutorial/getting-started.md"

// tutorialChannel is the line of the tutorial's main.go that opens the channel; the test gives
// it the test's prefix, so that its queues are the test's own on a shared broker.
const tutorialChannel = `amqpchannel.Config{URL: os.Getenv("AMQP_URL")}`

// TestTutorial follows the getting-started page as a newcomer would, in a module of its own
// outside the repository: go mod init, a replace to this checkout, the page's main.go and
// main_test.go, go mod tidy (from the module cache the repository's own build filled, and
// through the configured GOPROXY for what the new module's graph needs beyond it: a module
// without graph pruning reads the go.mod of older versions the repository never downloads),
// go test (the nudgetest kit), then the
// program on PostgreSQL and RabbitMQ until it prints the ticket it read back, nudge status
// from the module, and Ctrl-C. It also checks the Go version the page asks for against the
// module's go directive.
func TestTutorial(t *testing.T) {
	t.Parallel()
	page := parseMarkdown(t, tutorial)
	program, test := tutorialFiles(t, page)
	requireGoVersion(t, page)

	db := pgtest.New(t)
	broker := amqptest.New(t)
	abs, err := filepath.Abs(root)
	require.NoError(t, err)
	dir := t.TempDir()
	env := append(os.Environ(), "GOSUMDB=off", "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local", "CI=true",
		"DATABASE_URL="+db.URL, "AMQP_URL="+broker.URL, "NUDGE_DATABASE_URL="+db.URL,
		"TUTORIAL_AMQP_PREFIX="+broker.Prefix)
	ctx := testwait.Context(t, 10*time.Minute)
	goCmd := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s: go %s:\n%s", tutorial, strings.Join(args, " "), out)
		return string(out)
	}

	goCmd("mod", "init", "example.com/tickets")
	goCmd("mod", "edit", "-replace", "github.com/nudgeworks/nudge="+abs)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(program), 0o644))
	goCmd("mod", "tidy")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main_test.go"), []byte(test), 0o644))
	out := goCmd("test", "-count=1", "-v", "./...")
	require.Contains(t, out, "--- PASS: TestTicketList ", "the tutorial's test did not run:\n%s", out)
	goCmd("build", "-o", "tickets", ".")

	runTutorialProgram(ctx, t, dir, env, func() {
		status := goCmd("run", "github.com/nudgeworks/nudge/cmd/nudge", "status")
		require.Regexp(t, `(?m)^ticket_list\s+caught_up\s`, status, "nudge status in the tutorial's module")
	})
}

// tutorialFiles returns the page's main.go (its Go block with package main and no test, the
// channel given the test's prefix) and main_test.go (its block with package main and tests).
func tutorialFiles(t *testing.T, page mdDoc) (program, test string) {
	t.Helper()
	for _, b := range page.blocks {
		if b.lang != "go" || !strings.HasPrefix(b.code, "package main") && !strings.Contains(b.code, "\npackage main\n") {
			continue
		}
		if testFunc.MatchString(b.code) {
			require.Empty(t, test, "%s line %d: a second test file", tutorial, b.line)
			test = b.code
			continue
		}
		require.Empty(t, program, "%s line %d: a second program", tutorial, b.line)
		program = b.code
		require.Contains(t, program, tutorialChannel, "%s line %d: TestTutorial gives this channel its prefix", tutorial, b.line)
		program = strings.Replace(program, tutorialChannel,
			`amqpchannel.Config{URL: os.Getenv("AMQP_URL"), Prefix: os.Getenv("TUTORIAL_AMQP_PREFIX")}`, 1)
	}
	require.NotEmpty(t, program, "%s: no Go block with package main", tutorial)
	require.NotEmpty(t, test, "%s: no Go block with package main and a test", tutorial)
	return program, test
}

// goDirective finds go.mod's go directive and its release (1.26 of go 1.26.0).
var goDirective = regexp.MustCompile(`(?m)^go (\d+\.\d+)`)

// requireGoVersion: the page asks for the Go release the module's go directive names.
func requireGoVersion(t *testing.T, page mdDoc) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	m := goDirective.FindSubmatch(raw)
	require.NotNil(t, m, "go.mod has no go directive")
	want := "Go " + string(m[1]) + " or newer"
	require.Contains(t, strings.Join(page.prose, "\n"), want, "%s: the module's go directive is %s", tutorial, m[0])
}

// runTutorialProgram starts the tutorial's program built in dir, waits until it prints the
// ticket it read back from the read model and that it runs, calls then, and stops it as
// Ctrl-C would: it must exit 0.
func runTutorialProgram(ctx context.Context, t *testing.T, dir string, env []string, then func()) {
	t.Helper()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "tickets"))
	cmd.Dir, cmd.Env = dir, env
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() { // after a failure: the program must not outlive the test's database
		_ = cmd.Process.Kill() // an error when it has exited
		for range lines {
		}
		if err := <-exited; err != nil {
			t.Logf("the tutorial's program: %v", err)
		}
	})

	read := regexp.MustCompile(`^ticket \d+ in the read model: "Printer on fire"$`)
	var got []string
	for !slices.Contains(got, "running; Ctrl-C to stop") {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the tutorial's program ended early; it printed %q, logged:\n%s", got, stderr.String())
			got = append(got, l)
		case <-ctx.Done():
			t.Fatalf("the tutorial's program printed %q and no more; logged:\n%s", got, stderr.String())
		}
	}
	require.Len(t, got, 2, "the tutorial's program printed %q", got)
	require.Regexp(t, read, got[0])

	then()

	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	for l := range lines { // until the program closes its output
		got = append(got, l)
	}
	select {
	case err := <-exited:
		exited <- err // for the cleanup
		require.NoError(t, err, "the tutorial's program after Ctrl-C; logged:\n%s", stderr.String())
	case <-ctx.Done():
		t.Fatalf("the tutorial's program did not stop after Ctrl-C; logged:\n%s", stderr.String())
	}
}

// syncBuffer is the program's log, written by exec's copying goroutine and read by the test's
// messages while the program runs.
type syncBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
