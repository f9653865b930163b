// Package gdbstop holds a running process at chosen functions with gdb, so a test can force an
// interleaving of two PostgreSQL backends that no timing could produce reliably: stop one
// backend inside its commit, let another run a statement against that state, then move on.
//
// It drives gdb through its machine interface (MI). Breakpoints are set by function name, which
// needs only the binary's symbol table: PostgreSQL's server exports its functions for
// extensions, so no debug symbols are needed.
package gdbstop

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nudgeworks/nudge/internal/testwait"
)

// Process is a process attached under gdb. Its methods are not safe for concurrent use.
type Process struct {
	pid     int
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	results chan string // ^done, ^running, ^error lines
	stops   chan string // *stopped lines
	mu      sync.Mutex
}

// Available reports why gdb cannot be used here, or nil.
func Available() error {
	if _, err := exec.LookPath("gdb"); err != nil {
		return errors.New("gdb is not installed (apt-get install gdb)")
	}
	return nil
}

// ForTest is Attach for a test: it skips t where gdb is missing (fails it with CI=true), fails
// it if the attach fails, and detaches when t ends.
func ForTest(t testing.TB, pid int) *Process {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("gdbstop: " + err.Error())
		}
		t.Skip("gdbstop: " + err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), testwait.For(2*time.Minute))
	defer cancel()
	p, err := Attach(ctx, pid)
	if err != nil {
		t.Fatalf("gdbstop: %v", err)
	}
	t.Cleanup(func() { p.Detach() })
	return p
}

// Attach attaches gdb to pid. The process is stopped when Attach returns: set breakpoints, then
// Continue.
func Attach(ctx context.Context, pid int) (*Process, error) {
	cmd := exec.Command("gdb", "--interpreter=mi2", "-nx", "-q",
		"-iex", "set debuginfod enabled off", "-iex", "set auto-solib-add off",
		"-iex", "set pagination off", "-iex", "set confirm off", "-iex", "set mi-async on")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start gdb: %w", err)
	}
	p := &Process{pid: pid, cmd: cmd, stdin: stdin, results: make(chan string, 16), stops: make(chan string, 16)}
	go p.read(stdout)
	if _, err := p.command(ctx, "-target-attach "+strconv.Itoa(pid)); err != nil {
		p.kill()
		return nil, fmt.Errorf("attach gdb to %d: %w", pid, err)
	}
	// Attaching stops the process; gdb reports it as a stop of its own.
	if _, err := p.wait(ctx, p.stops); err != nil {
		p.kill()
		return nil, fmt.Errorf("attach gdb to %d: %w", pid, err)
	}
	return p, nil
}

func (p *Process) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "^"):
			p.results <- line
		case strings.HasPrefix(line, "*stopped"):
			p.stops <- line
		}
	}
	close(p.results)
	close(p.stops)
}

func (p *Process) wait(ctx context.Context, ch <-chan string) (string, error) {
	select {
	case line, ok := <-ch:
		if !ok {
			return "", errors.New("gdb exited")
		}
		return line, nil
	case <-ctx.Done():
		return "", fmt.Errorf("waiting for gdb: %w", ctx.Err())
	}
}

// command sends one MI command and returns its result line; ^error is an error.
func (p *Process) command(ctx context.Context, cmd string) (string, error) {
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		return "", fmt.Errorf("gdb %s: %w", cmd, err)
	}
	line, err := p.wait(ctx, p.results)
	if err != nil {
		return "", fmt.Errorf("gdb %s: %w", cmd, err)
	}
	if strings.HasPrefix(line, "^error") {
		return line, fmt.Errorf("gdb %s: %s", cmd, line)
	}
	return line, nil
}

// Break sets a breakpoint at the start of function fn. The process must be stopped.
func (p *Process) Break(ctx context.Context, fn string) error {
	_, err := p.command(ctx, "-break-insert "+fn)
	return err
}

// ClearBreaks deletes every breakpoint. The process must be stopped.
func (p *Process) ClearBreaks(ctx context.Context) error {
	_, err := p.command(ctx, "-break-delete")
	return err
}

// Continue resumes the stopped process.
func (p *Process) Continue(ctx context.Context) error {
	_, err := p.command(ctx, "-exec-continue")
	return err
}

// WaitBreak waits until the running process stops at a breakpoint and returns the function it
// stopped in.
func (p *Process) WaitBreak(ctx context.Context) (string, error) {
	fn, _, err := p.WaitBreakOr(ctx, nil)
	return fn, err
}

// WaitBreakOr is WaitBreak that also returns when done is closed first (ok false): for a
// process that may or may not reach a breakpoint again.
func (p *Process) WaitBreakOr(ctx context.Context, done <-chan struct{}) (fn string, ok bool, err error) {
	select {
	case <-done:
		return "", false, nil
	default:
	}
	select {
	case <-done:
		return "", false, nil
	case line, open := <-p.stops:
		if !open {
			return "", false, errors.New("gdb exited")
		}
		if !strings.Contains(line, `reason="breakpoint-hit"`) {
			return "", false, fmt.Errorf("process %d stopped for another reason: %s", p.pid, line)
		}
		_, rest, _ := strings.Cut(line, `func="`)
		fn, _, _ = strings.Cut(rest, `"`)
		return fn, true, nil
	case <-ctx.Done():
		return "", false, fmt.Errorf("waiting for gdb: %w", ctx.Err())
	}
}

// Detach deletes the breakpoints, lets the process run on and ends gdb. It is safe to call
// more than once and on a running process (it interrupts it first).
func (p *Process) Detach() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.command(ctx, "-exec-interrupt"); err == nil {
		_, _ = p.wait(ctx, p.stops)
	}
	_, _ = p.command(ctx, "-break-delete")
	_, _ = p.command(ctx, "-target-detach")
	_, _ = io.WriteString(p.stdin, "-gdb-exit\n")
	_ = p.stdin.Close()
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		p.kill()
	}
	p.cmd = nil
}

func (p *Process) kill() {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
}
